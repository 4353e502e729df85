package audit_test

import (
	"context"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// FuzzSealedDetailRoundTrips writes records with generated details (an operation event and an approval event
// each time), seals them, and checks what the sequencer hashed against what the writer sent: the detail as jsonb
// gives it back has the canonical JSON (auditchain.Canonical) of the detail sent, byte for byte, so the seal's
// entry is the hash of the writer's content; and audit.Verify finds both records intact. Numbers are every kind the API's edge lets through (auditchain.ExactNumber: the 10^16
// and 10^17, 2^53, 1e21, 1e-7, subnormals) and every double Go writes; member names include those whose
// UTF-16 order differs from code point order; strings, any text PostgreSQL stores.
func FuzzSealedDetailRoundTrips(f *testing.F) {
	for _, s := range []struct {
		number, name, text string
		x                  float64
		i                  int64
	}{
		{"10000000000000000", "expected_environment_version", "agent:a", 1e16, 1e16},
		{"100000000000000000", "a", "b", 1e17, 1 << 53},
		{"9007199254740992", "é", "op_\"3\\", math.Pow(2, 53), -(1 << 53)},
		{"9007199254740993", "\ue000", "😀", 9007199254740993, math.MaxInt64},
		{"1e21", "😀", "\ue000", 1e21, 1 << 62},
		{"1e-7", "\uffff", "a\u2028b\x01é😀\xff", 1e-7, -1},
		{"0.30000000000000004", "", "<t&>\n\t\"", 0.1 + 0.2, 0},
		{"2.50", "E", "acct\n", math.Copysign(0, -1), 201},
		{"1.7976931348623157e308", "ea", "\x7f", math.MaxFloat64, 12},
		{"5e-324", "日", "", math.SmallestNonzeroFloat64, 1e15},
		{"-1.5e-310", "\U0010ffff", "x", 1.5e-310, -999999999999999},
		{"123456789012345678", "n", "y", 123456789012345680, 1234567890123456},
		{"1e400", "m", "z", 1e300, 1e18},
		{"0.000001", "k", "w", 1e-6, 1e9},
		{"-0", "k2", "v", 999999999999999900000, 9_007_199_254_740_991},
	} {
		f.Add(s.number, s.name, s.text, s.x, s.i)
	}
	db := testdb.Schema(f)
	ctx := context.Background()
	s := &audit.Sequencer{DB: db.Pool}
	f.Fuzz(func(t *testing.T, number, name, text string, x float64, i int64) {
		name, text = storable(name), storable(text)
		numbers := []any{}
		if json.Valid([]byte(number)) && auditchain.ExactNumber(number) {
			numbers = append(numbers, json.RawMessage(number))
		}
		if !math.IsInf(x, 0) && !math.IsNaN(x) {
			numbers = append(numbers, x, -x)
		}
		if s := strconv.FormatInt(i, 10); auditchain.ExactNumber(s) {
			numbers = append(numbers, i)
		}
		detail, err := json.Marshal(map[string]any{
			name: numbers, "attempt_id": text, "outcome": "created", "status": 201,
			"nested": map[string]any{text: map[string]any{name: true, text: false, "z" + name: nil, "0": []any{}}, "s": text},
		})
		if err != nil {
			t.Fatal(err)
		}

		opID, approvalID := opstatus.NewID(), ids.New("apv_")
		err = db.Exec(`WITH op AS (
    INSERT INTO operations (id, account_id, kind, state) VALUES (?, 'acct_fuzz', 'tickets.create', 'succeeded') RETURNING id, account_id
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, actor, detail) SELECT id, account_id, 'completed', ?, ?::jsonb FROM op
)
INSERT INTO approval_events (approval_id, account_id, type, actor, detail) VALUES (?, 'acct_fuzz', 'requested', ?, ?::jsonb)`,
			opID, text, string(detail), approvalID, text, string(detail)).Error
		if err != nil {
			t.Fatal(err)
		}
		var stored struct {
			ID        int64
			Detail    string
			CreatedAt time.Time
		}
		if err := db.Raw(`SELECT id, detail::text AS detail, created_at FROM operation_events WHERE account_id = 'acct_fuzz' AND operation_id = ?`,
			opID).Scan(&stored).Error; err != nil {
			t.Fatal(err)
		}
		back, err := auditchain.Canonical(json.RawMessage(stored.Detail))
		if err != nil {
			t.Fatal(err)
		}
		sent, err := auditchain.Canonical(json.RawMessage(detail))
		if err != nil {
			t.Fatal(err)
		}
		if string(back) != string(sent) {
			t.Fatalf("canonical JSON of the detail:\n  sent %s\n stored %s", sent, back)
		}
		testdb.SealAll(t, s)
		want, err := auditchain.RecordHash(map[string]any{"account_id": "acct_fuzz", "actor": text, "created_at": auditchain.FormatTime(stored.CreatedAt),
			"detail": json.RawMessage(detail), "from_state": nil, "operation_id": opID, "to_state": nil, "type": "completed"})
		if err != nil {
			t.Fatal(err)
		}
		var entry string
		if err := db.Raw(`SELECT e->>'hash' FROM audit_seals, jsonb_array_elements(records) e
WHERE e->>'table' = 'operation_events' AND (e->>'id')::bigint = ?`, stored.ID).Scan(&entry).Error; err != nil {
			t.Fatal(err)
		}
		if entry != want {
			t.Fatalf("the seal holds hash %s for detail %s; the writer's content hashes to %s", entry, stored.Detail, want)
		}
		rep, err := audit.Verify(ctx, db.Pool, audit.VerifyOptions{AccountID: "acct_fuzz", OperationID: opID, Subjects: []string{approvalID}})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Intact() || rep.Records != 2 || rep.Sealed != 2 {
			t.Fatalf("verify of records with detail %s: %+v", detail, rep)
		}
	})
}

// storable is s as PostgreSQL can store it in text: valid UTF-8 without NUL.
func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}

// TestStoredNumberIsRFC8785 names the numbers the canonical forms once disagreed on (issue 22), and the layouts
// of RFC 8785 (ECMAScript's Number.prototype.toString): each as jsonb stores and gives it back, canonicalized.
func TestStoredNumberIsRFC8785(t *testing.T) {
	t.Parallel()
	tx := testdb.Tx(t)
	for in, want := range map[string]string{
		"10000000000000000": "10000000000000000", "1e16": "10000000000000000", "100000000000000000": "100000000000000000",
		"9007199254740992": "9007199254740992", "-9007199254740993": "-9007199254740992",
		"9223372036854775807": "9223372036854776000", "1e21": "1e+21", "123e20": "1.23e+22", "1e-7": "1e-7",
		"0.000001": "0.000001", "-1.50": "-1.5", "0.30000000000000001": "0.3", "0.1": "0.1", "5e-324": "5e-324",
		"1e-400": "0", "-0": "0", "0.0": "0", "1.7976931348623157e308": "1.7976931348623157e+308", "12.5e-3": "0.0125",
		"999999999999999900000": "999999999999999900000", "1234567.0e2": "123456700",
	} {
		var stored string
		if err := tx.Raw(`SELECT ?::jsonb::text`, in).Scan(&stored).Error; err != nil {
			t.Fatal(err)
		}
		got, err := auditchain.Canonical(json.RawMessage(stored))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s: stored as %s, canonical %s, want %s", in, stored, got, want)
		}
	}
}
