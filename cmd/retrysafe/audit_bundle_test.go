package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// noDatabase is a DATABASE_URL nothing listens on: `audit verify --bundle` must not need one.
const noDatabase = "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"

// TestAuditBundle exports the audit record with `retrysafe audit export`, checks the bundle with `audit verify
// --bundle` and no database (exit 0), then tampers with it in each way an auditor must catch (exit 1), and pins
// the newest seal with --seal.
func TestAuditBundle(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	seed := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	signer, _ := auditchain.ParseSigningKey(seed)
	var ops []string
	for i := range 3 {
		id := opstatus.NewID()
		err := db.Exec(`WITH op AS (
    INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint) VALUES (?, 'acct_a', 'tickets.create', 'running', ?, 'sha256:abc') RETURNING id, account_id, state
)
INSERT INTO operation_events (operation_id, account_id, type, to_state, actor) SELECT id, account_id, 'claimed', state, 'agent:a' FROM op`,
			id, fmt.Sprintf("key-%d", i)).Error
		if err != nil {
			t.Fatal(err)
		}
		if err := opstatus.Append(ctx, db.Pool, "acct_a", id, opstore.EventReplayed, "agent:a", map[string]any{"status": 201}); err != nil {
			t.Fatal(err)
		}
		if _, err := opstatus.Transition(ctx, db.Pool, "acct_a", id, opstatus.StateSucceeded, "agent:a"); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, id)
	}
	w := &audit.Sequencer{DB: db.Pool, Signer: signer}
	first := testdb.SealAll(t, w)
	if err := opstatus.Append(ctx, db.Pool, "acct_a", ops[1], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	last := testdb.SealAll(t, w)[0]

	var out bytes.Buffer
	err := run(ctx, []string{"audit", "export"}, env(map[string]string{"DATABASE_URL": db.DSN, "AUDIT_SIGNING_KEY": seed}), &out)
	if err != nil {
		t.Fatalf("export: %v\n%s", err, out.String())
	}
	exported := out.Bytes()
	dir := t.TempDir()
	verify := func(bundle []byte, args ...string) (int, string) {
		t.Helper()
		path := filepath.Join(dir, "bundle.json")
		if err := os.WriteFile(path, bundle, 0o600); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		err := run(ctx, append([]string{"audit", "verify", "--bundle", path}, args...), env(map[string]string{"DATABASE_URL": noDatabase}), &buf)
		if err != nil {
			return exitCode(err), buf.String() + err.Error()
		}
		return 0, buf.String()
	}
	code, text := verify(exported)
	want := fmt.Sprintf("checked 10 records of 3 operations and approvals: 10 sealed, by %d seals; 0 not sealed yet", len(first)+1)
	if code != 0 || !strings.Contains(text, "INTACT") || !strings.Contains(text, want) ||
		!strings.Contains(text, "the bundle's own public key") || !strings.Contains(text, ": the whole record, exported at") {
		t.Fatalf("intact bundle: exit %d\n%s", code, text)
	}
	if code, text := verify(exported, "--seal", last.Hash, "--public-key", signer.PublicKey()); code != 0 || !strings.Contains(text, "checked with --public-key") {
		t.Fatalf("intact bundle, pinned to the newest seal: exit %d\n%s", code, text)
	}

	// Each case edits a fresh copy of the bundle as JSON.
	type doc = map[string]any
	// records are the bundle's records of one subject, in the bundle's order.
	records := func(d doc, subject string) []doc {
		var out []doc
		for _, r := range d["records"].([]any) {
			if r.(doc)["subject"] == subject {
				out = append(out, r.(doc))
			}
		}
		return out
	}
	drop := func(d doc, gone func(r doc) bool) {
		d["records"] = slices.DeleteFunc(d["records"].([]any), func(r any) bool { return gone(r.(doc)) })
	}
	seals := func(d doc) []any { return d["seals"].([]any) }
	// dropNewest removes ops[1]'s newest record, the one the newest seal holds.
	dropNewest := func(d doc) {
		recs := records(d, ops[1])
		newest := recs[len(recs)-1]
		drop(d, func(r doc) bool { return r["id"] == newest["id"] && r["table"] == newest["table"] })
	}
	// forgeNewestSeal drops ops[1]'s newest record and rewrites the newest seal to hold nothing, recomputing its
	// hashes; with attacker set, every seal is re-signed with another key, which replaces the bundle's.
	forgeNewestSeal := func(d doc, attacker *auditchain.Signer) {
		dropNewest(d)
		raw := seals(d)[len(seals(d))-1].(doc)
		at, _ := time.Parse(time.RFC3339Nano, raw["created_at"].(string))
		through := map[string]auditchain.Position{}
		rt, _ := json.Marshal(raw["through"])
		if err := json.Unmarshal(rt, &through); err != nil {
			t.Fatal(err)
		}
		s, err := auditchain.NextSeal(&auditchain.Seal{Seq: int64(raw["seq"].(float64)) - 1, Hash: raw["prev_hash"].(string),
			First: int64(raw["first"].(float64)), Count: 0}, at, []auditchain.Entry{}, through, nil)
		if err != nil {
			t.Fatal(err)
		}
		raw["records"], raw["records_hash"], raw["count"], raw["hash"] = []any{}, s.Records, 0, s.Hash
		if attacker != nil {
			for _, c := range seals(d) {
				c.(doc)["signature"] = attacker.Sign(c.(doc)["hash"].(string))
			}
			d["public_key"] = attacker.PublicKey()
		}
	}
	// dropOldest deletes the oldest seal and the records only it holds.
	dropOldest := func(d doc) {
		held := map[float64]bool{}
		for _, e := range seals(d)[0].(doc)["records"].([]any) {
			held[e.(doc)["id"].(float64)] = true
		}
		d["seals"] = seals(d)[1:]
		drop(d, func(r doc) bool { return held[r["id"].(float64)] })
	}
	// fabricate adds a record of ops[0] that no seal holds, at position xid.
	fabricate := func(d doc, table, xid string, at time.Time) {
		rec := maps.Clone(records(d, ops[0])[0])
		rec["table"], rec["id"], rec["xid"], rec["created_at"] = table, 900001, xid, at.Format(time.RFC3339Nano)
		rec["record"] = maps.Clone(rec["record"].(doc))
		rec["record"].(doc)["created_at"] = auditchain.FormatTime(at)
		d["records"] = append(d["records"].([]any), rec)
	}
	exportedAt := func(d doc) time.Time {
		at, err := time.Parse(time.RFC3339Nano, d["exported_at"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	attacker, _ := auditchain.ParseSigningKey(base64.StdEncoding.EncodeToString([]byte("attacker-key-0123456789abcdef012")))
	newest := fmt.Sprintf("(seals) seq %d", last.Seq)
	cases := []struct {
		name   string
		edit   func(d doc)
		args   []string
		code   int
		broken string
	}{
		// A record copied within the bundle is counted once, and reported.
		{"a record copied", func(d doc) { d["records"] = append(d["records"].([]any), maps.Clone(records(d, ops[0])[1])) }, nil, 1,
			"checked 10 records of 3 operations and approvals: 10 sealed,"},
		{"a record copied", func(d doc) { d["records"] = append(d["records"].([]any), maps.Clone(records(d, ops[0])[1])) }, nil, 1,
			"BROKEN inserted: " + ops[0] + " seq 0 (operation_events id "},
		// Where the seals end is in the header, which nothing signs; the newest seal says it too.
		{"a fabricated record, where the seals end deleted", func(d doc) {
			fabricate(d, "operation_events", "1", exportedAt(d))
			delete(d, "through")
		}, nil, 1, "BROKEN inserted: " + ops[0] + " seq 0 (operation_events id 900001): no seal holds it"},
		{"a fabricated record of no table", func(d doc) { fabricate(d, "ledger_events", "99999999", exportedAt(d)) }, nil, 1,
			"BROKEN inserted: " + ops[0] + " seq 0 (ledger_events id 900001): no table of audit records"},
		{"a fabricated record written after the export", func(d doc) {
			fabricate(d, "operation_events", "99999999", exportedAt(d).Add(time.Minute))
		}, nil, 1, "BROKEN changed: (bundle) seq 0 (exported_at): exported at"},
		// The scope is in the header too: a pinned seal anchors the first one whatever it says.
		{"the first seal deleted, the scope made a time range, pinned", func(d doc) {
			dropOldest(d)
			d["scope"] = doc{"since": seals(d)[0].(doc)["created_at"]}
		}, []string{"--seal", last.Hash}, 1, "BROKEN missing: (seals) seq 2 (seal 2): seals 1 to 1 are not here"},
		{"the first seal deleted, the scope made an operation, pinned", func(d doc) {
			dropOldest(d)
			d["scope"] = doc{"operation": ops[1]}
		}, []string{"--seal", last.Hash}, 1, "BROKEN missing: (seals) seq 2 (seal 2): seals 1 to 1 are not here"},
		// What a time range exported after the pinned seal holds.
		{"the first seal deleted, pinned to it", func(d doc) {
			dropOldest(d)
			d["scope"] = doc{"since": seals(d)[0].(doc)["created_at"]}
		}, []string{"--seal", first[0].Hash}, 0, ""},
		{"a changed field", func(d doc) { records(d, ops[0])[1]["record"].(doc)["actor"] = "agent:mallory" }, nil, 1, "BROKEN changed: " + ops[0]},
		{"a deleted record", func(d doc) {
			gone := records(d, ops[0])[1]
			drop(d, func(r doc) bool { return r["id"] == gone["id"] && r["table"] == gone["table"] })
		}, nil, 1, "BROKEN missing: " + ops[0]},
		{"a deleted operation", func(d doc) { drop(d, func(r doc) bool { return r["subject"] == ops[2] }) }, nil, 1, "BROKEN missing: " + ops[2]},
		{"reordered records", func(d doc) {
			recs := records(d, ops[0])
			recs[0]["record"], recs[1]["record"] = recs[1]["record"], recs[0]["record"]
		}, nil, 1, "BROKEN out of order: " + ops[0]},
		{"deleted newest records", dropNewest, nil, 1, "BROKEN missing: " + ops[1]},
		{"a forged seal", func(d doc) { forgeNewestSeal(d, nil) }, nil, 1, "BROKEN bad signature: " + newest},
		// Re-signed with the forger's key, which the bundle then carries: only a key or a seal's hash kept apart
		// from the bundle catches it.
		{"a forged, re-signed seal, checked with the bundle's key", func(d doc) { forgeNewestSeal(d, attacker) }, nil, 0, ""},
		{"a forged, re-signed seal, checked with the operator's key", func(d doc) { forgeNewestSeal(d, attacker) },
			[]string{"--public-key", signer.PublicKey()}, 1, "BROKEN bad signature: (seals) seq 1"},
		{"a forged, re-signed seal, pinned", func(d doc) { forgeNewestSeal(d, attacker) },
			[]string{"--seal", last.Hash}, 1, "BROKEN missing: (seals) seq 0: the pinned seal " + last.Hash},
		{"a forged seal with a wrong previous hash", func(d doc) {
			raw := seals(d)[len(seals(d))-1].(doc)
			raw["prev_hash"] = strings.Repeat("ab", 32)
			s := auditchain.Seal{Seq: last.Seq, Prev: strings.Repeat("ab", 32), At: last.At, First: last.First, Count: last.Count,
				Through: last.Through, Records: last.Records}
			raw["hash"], _ = s.Compute()
			raw["signature"] = signer.Sign(raw["hash"].(string)) // even with the key: the link breaks
		}, []string{"--public-key", signer.PublicKey()}, 1, "BROKEN changed: " + newest},
		// Seals are never deleted: a whole record starts at the first.
		{"the oldest seal deleted, with the records only it holds", func(d doc) {
			oldest := seals(d)[0].(doc)
			held := map[float64]bool{}
			for _, e := range oldest["records"].([]any) {
				held[e.(doc)["id"].(float64)] = true
			}
			d["seals"] = seals(d)[1:]
			drop(d, func(r doc) bool { return held[r["id"].(float64)] })
		}, nil, 1, "BROKEN missing: (seals) seq 2"},
		// The newest seal deleted, and where the seals end rewound to match: its record looks written since.
		{"the newest seal deleted", func(d doc) {
			d["seals"] = seals(d)[:len(seals(d))-1]
			d["through"] = seals(d)[len(seals(d))-1].(doc)["through"]
		}, nil, 0, "1 not sealed yet"},
		{"the newest seal deleted, pinned", func(d doc) {
			d["seals"] = seals(d)[:len(seals(d))-1]
			d["through"] = seals(d)[len(seals(d))-1].(doc)["through"]
		}, []string{"--seal", last.Hash}, 1, "BROKEN missing: (seals)"},
		{"the newest seal deleted, where the seals end left", func(d doc) {
			d["seals"] = seals(d)[:len(seals(d))-1]
		}, nil, 1, "BROKEN inserted: " + ops[1]},
	}
	for _, tc := range cases {
		var d doc
		if err := json.Unmarshal(exported, &d); err != nil {
			t.Fatal(err)
		}
		tc.edit(d)
		edited, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		code, text := verify(edited, tc.args...)
		if code != tc.code || (tc.broken != "" && !strings.Contains(text, tc.broken)) || (tc.code == 0 && !strings.Contains(text, "INTACT")) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", tc.name, code, tc.code, tc.broken, text)
		}
	}

	// Data after the bundle's object is not a bundle: exit 2, saying so.
	for _, tail := range []string{`{"format":"` + audit.BundleFormat + `"}`, "garbage", "]"} {
		if code, text := verify(append(bytes.Clone(exported), tail...)); code != 2 || !strings.Contains(text, "data after its JSON object") {
			t.Errorf("a bundle followed by %q: exit %d\n%s", tail, code, text)
		}
	}

	// What cannot be checked is exit 2.
	if code, text := verify([]byte(`{"format":"something else"}`)); code != 2 {
		t.Errorf("not a bundle: exit %d\n%s", code, text)
	}
	if code, _ := run2(t, noDatabase, "audit", "verify", "--bundle", filepath.Join(dir, "absent.json")); code != 2 {
		t.Errorf("no such file: exit %d", code)
	}
	if code, _ := run2(t, noDatabase, "audit", "verify", "--bundle", "b.json", "--operation", ops[0]); code != 2 {
		t.Errorf("--bundle with --operation: exit %d", code)
	}
	if code, _ := run2(t, db.DSN, "audit", "export", "--operation", ops[0], "--since", "2026-01-01T00:00:00Z"); code != 2 {
		t.Errorf("export --operation with --since: exit %d", code)
	}
	if code, text := run2(t, db.DSN, "audit", "export", "--operation", "op_missing"); code != 2 || strings.Contains(text, "format") {
		t.Errorf("export of an unknown operation: exit %d\n%s", code, text)
	}

	// A bundle exported --until holds no records not sealed yet: one added to it was made up.
	code, until := run2(t, db.DSN, "audit", "export", "--until", last.At.Add(time.Second).Format(time.RFC3339Nano))
	if code != 0 {
		t.Fatalf("export --until: exit %d\n%s", code, until)
	}
	d := mustDoc(t, []byte(until))
	fabricate(d, "operation_events", "99999999", exportedAt(d))
	edited, _ := json.Marshal(d)
	if code, text := verify(edited); code != 1 || !strings.Contains(text, "BROKEN inserted: (bundle) seq 0 (scope): it was exported until") {
		t.Errorf("a record not sealed yet in a bundle exported --until: exit %d\n%s", code, text)
	}

	// Sealing stalled is judged at the export's time, not the auditor's.
	if err := opstatus.Append(ctx, db.Pool, "acct_a", ops[2], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	code, fresh := run2(t, db.DSN, "audit", "export")
	if code != 0 {
		t.Fatalf("export: exit %d\n%s", code, fresh)
	}
	if code, text := verify([]byte(fresh)); code != 0 || !strings.Contains(text, "1 not sealed yet") || !strings.Contains(text, "INTACT") {
		t.Errorf("a record not sealed yet, exported at once: exit %d\n%s", code, text)
	}
	d = mustDoc(t, []byte(fresh))
	d["exported_at"] = exportedAt(d).Add(time.Hour).Format(time.RFC3339Nano)
	edited, _ = json.Marshal(d)
	if code, text := verify(edited); code != 1 || !strings.Contains(text, "STALLED") || !strings.Contains(text, "by the time the bundle was exported") {
		t.Errorf("a record waiting an hour when the bundle was exported: exit %d\n%s", code, text)
	}
}

func mustDoc(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}
