package audit_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/poll"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

func testSigner(t *testing.T) (*auditchain.Signer, ed25519.PublicKey) {
	t.Helper()
	seed := make([]byte, 32)
	copy(seed, "retrysafe audit test signing key")
	s, err := auditchain.ParseSigningKey(base64.StdEncoding.EncodeToString(seed))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := auditchain.ParsePublicKey(s.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	return s, pub
}

// history writes n operations of three events each, with details that exercise the SQL canonicalization.
func history(t *testing.T, db *gorm.DB, n int) []string {
	t.Helper()
	ctx := context.Background()
	var opIDs []string
	for i := range n {
		op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct_a", Kind: "tickets.create", State: opstatus.StateRunning,
			IdempotencyKey: fmt.Sprintf("key-%d", i), Fingerprint: "sha256:abc"}
		err := db.Exec(`WITH op AS (
    INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint) VALUES (?, ?, ?, ?, ?, ?) RETURNING id, account_id, state
)
INSERT INTO operation_events (operation_id, account_id, type, to_state, actor) SELECT id, account_id, 'claimed', state, 'agent:a' FROM op`,
			op.ID, op.AccountID, op.Kind, op.State, op.IdempotencyKey, op.Fingerprint).Error
		if err != nil {
			t.Fatal(err)
		}
		detail := map[string]any{
			"attempt_id": fmt.Sprintf("att_%d", i), "status": 201, "neg": -42, "big": int64(1) << 52, "ratio": 1.5,
			"text":   "quote \" backslash \\ tab \t nl \n ctl \u0001 del \u007f é 日本 😀 <&>",
			"nested": map[string]any{"z": []any{true, false, nil, "x"}, "a": map[string]any{}, "é": 1, "e": 2, "": 0},
		}
		if err := opstatus.Append(ctx, database.SQL(db), op.AccountID, op.ID, opstore.EventReplayed, "agent:a", detail); err != nil {
			t.Fatal(err)
		}
		if _, err := opstatus.Transition(ctx, database.SQL(db), op.AccountID, op.ID, opstatus.StateSucceeded, "agent:a"); err != nil {
			t.Fatal(err)
		}
		opIDs = append(opIDs, op.ID)
	}
	// An approval requested, approved and used: its own records, written by the approvals trigger.
	err := db.Exec(`INSERT INTO approvals (id, account_id, method, path, route, idempotency_key, fingerprint, summary, state, requested_by, expires_at)
VALUES ('apv_1', 'acct_a', 'POST', '/v1/deploys', '/v1/deploys', 'k', 'fp', '{"environment":"production"}', 'pending', 'agent:a', now() + interval '1 hour')`).Error
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`UPDATE approvals SET state = 'approved', decided_by = 'approver:b', decided_at = now() WHERE id = 'apv_1'`).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`UPDATE approvals SET used_by_operation_id = ? WHERE id = 'apv_1'`, opIDs[0]).Error; err != nil {
		t.Fatal(err)
	}
	return opIDs
}

func mustVerify(t *testing.T, db *gorm.DB, opt audit.VerifyOptions) audit.Report {
	t.Helper()
	rep, err := audit.Verify(context.Background(), testdb.Pool(t, db), opt)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestSealedRecordsVerify(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	signer, pub := testSigner(t)
	ops := history(t, db.DB, 3)
	s := &audit.Sequencer{DB: db.Pool, Signer: signer}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub}); !rep.Intact() || rep.Unsealed != 12 || rep.Sealed != 0 || rep.Seals != 0 {
		t.Fatalf("before any seal: every record is reported unsealed: %+v", rep)
	}
	first := testdb.SealAll(t, s)
	var sealed int64
	for _, seal := range first {
		sealed += seal.Count
	}
	if sealed != 3*3+3 {
		t.Fatalf("the first seals hold %d records; want the 9 events of 3 operations and 3 of the approval", sealed)
	}
	if again, err := s.RunOnce(context.Background()); err != nil || again != nil {
		t.Fatalf("nothing new: no seal, got %v %v", again, err)
	}
	if err := opstatus.Append(context.Background(), db.Pool, "acct_a", ops[1], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	if n, oldest, err := audit.Pending(context.Background(), db.Pool); err != nil || n != 1 || oldest.IsZero() {
		t.Fatalf("pending after one append: %d %v %v", n, oldest, err)
	}
	rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub})
	if !rep.Intact() || rep.Unsealed != 1 || rep.Sealed != 12 || rep.OldestUnsealed.IsZero() {
		t.Fatalf("one record not sealed yet: %+v", rep)
	}
	second := testdb.SealAll(t, s)
	if len(second) != 1 || second[0].Count != 1 || second[0].First != sealed+1 || second[0].Prev != first[len(first)-1].Hash {
		t.Fatalf("the next seal holds only the new record, after the others: %+v", second)
	}

	rep = mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub})
	if !rep.Intact() || rep.Subjects != 4 || rep.Records != 13 || rep.Sealed != 13 || rep.Unsealed != 0 ||
		rep.Seals != len(first)+1 || rep.LastSeal.Hash != second[0].Hash {
		t.Fatalf("report %+v", rep)
	}
	if rep.Stalled(time.Now(), time.Second) {
		t.Fatalf("nothing unsealed, yet stalled: %+v", rep)
	}
	rep = mustVerify(t, db.DB, audit.VerifyOptions{OperationID: ops[2], PublicKey: pub})
	if !rep.Intact() || rep.Subjects != 1 || rep.Records != 3 || rep.Sealed != 3 {
		t.Fatalf("one operation: %+v", rep)
	}
	// --since: only the second seal and the record it holds.
	rep = mustVerify(t, db.DB, audit.VerifyOptions{Since: second[0].At, PublicKey: pub})
	if !rep.Intact() || rep.Seals != 1 || rep.Records != 1 {
		t.Fatalf("since the second seal: %+v", rep)
	}
	db.Tampered()
	exec(t, db.DB, `DELETE FROM operation_events WHERE operation_id = ? AND id = (SELECT max(id) FROM operation_events WHERE operation_id = ?)`, ops[1], ops[1])
	if rep = mustVerify(t, db.DB, audit.VerifyOptions{Since: second[0].At, PublicKey: pub}); rep.Intact() || rep.Problems[0].Kind != auditchain.Missing {
		t.Fatalf("since, after deleting the sealed record: %+v", rep)
	}
}

// nth is the condition "the record of operation op that is nth (from 1) in its history".
const nth = `id = (SELECT id FROM operation_events WHERE operation_id = ? ORDER BY id OFFSET ? LIMIT 1)`

func TestVerifyFindsTampering(t *testing.T) {
	t.Parallel()
	signer, pub := testSigner(t)
	// Each case tampers as an attacker with database access would: triggers off, plain SQL.
	tests := []struct {
		name   string
		tamper func(t *testing.T, db *gorm.DB, ops []string)
		kind   auditchain.Kind
		// keyless verifies without the public key: what the chain of seals catches on its own.
		keyless bool
	}{
		{"one field of one event changed", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `UPDATE operation_events SET actor = 'agent:mallory' WHERE `+nth, ops[1], 1)
		}, auditchain.Changed, false},
		{"a record made an attempt record by its columns, its detail untouched", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `UPDATE operation_events SET attempt_id = 'att_mallory', outcome = 'created' WHERE `+nth, ops[1], 1)
		}, auditchain.Changed, false},
		{"a middle record deleted", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `DELETE FROM operation_events WHERE `+nth, ops[1], 1)
		}, auditchain.Missing, false},
		{"a whole operation deleted with its records", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `DELETE FROM operation_events WHERE operation_id = ?`, ops[1])
			exec(t, db, `DELETE FROM operations WHERE id = ?`, ops[1])
		}, auditchain.Missing, false},
		{"two records swapped", func(t *testing.T, db *gorm.DB, ops []string) {
			var ids []int64
			if err := db.Raw(`SELECT id FROM operation_events WHERE operation_id = ? ORDER BY id OFFSET 1 LIMIT 2`, ops[1]).Scan(&ids).Error; err != nil {
				t.Fatal(err)
			}
			exec(t, db, `UPDATE operation_events SET id = CASE id WHEN ? THEN ?::bigint ELSE ?::bigint END WHERE id IN (?, ?)`, ids[0], -ids[1], -ids[0], ids[0], ids[1])
			exec(t, db, `UPDATE operation_events SET id = -id WHERE id IN (?, ?)`, -ids[0], -ids[1])
		}, auditchain.OutOfOrder, false},
		{"the newest record of an operation deleted", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `DELETE FROM operation_events WHERE `+nth, ops[1], 2)
		}, auditchain.Missing, false},
		{"the newest records of all deleted", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `DELETE FROM operation_events WHERE id >= (SELECT id FROM operation_events WHERE operation_id = ? ORDER BY id LIMIT 1)`, ops[1])
		}, auditchain.Missing, false},
		{"an approval decision rewritten", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `UPDATE approval_events SET actor = 'approver:mallory' WHERE type = 'approved'`)
		}, auditchain.Changed, false},
		{"a record rewritten and its seal forged with another key", func(t *testing.T, db *gorm.DB, ops []string) {
			forge(t, db, ops[1], func(s *auditchain.Seal, mallory *auditchain.Signer) {
				s.Hash, _ = s.Compute()
				s.Signature = mallory.Sign(s.Hash)
			})
		}, auditchain.BadSignature, false},
		{"a record rewritten and its seal forged with a wrong previous hash", func(t *testing.T, db *gorm.DB, ops []string) {
			forge(t, db, ops[1], func(s *auditchain.Seal, _ *auditchain.Signer) {
				s.Prev = strings.Repeat("ab", 32)
				s.Hash, _ = s.Compute()
			})
		}, auditchain.Changed, true},
		{"every table of records truncated", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `TRUNCATE operation_events, approval_events`)
		}, auditchain.Missing, false},
		{"a record inserted among the sealed ones", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `INSERT INTO operation_events (operation_id, account_id, type, actor, xid) VALUES (?, 'acct_a', 'observed', 'agent:mallory', '1')`, ops[1])
		}, auditchain.Inserted, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := testdb.Schema(t)
			db.Tampered()
			ops := history(t, db.DB, 3)
			testdb.SealAll(t, &audit.Sequencer{DB: db.Pool, Signer: signer})
			if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub}); !rep.Intact() {
				t.Fatalf("before tampering: %v", rep.Problems)
			}
			tt.tamper(t, db.DB, ops)
			key := pub
			if tt.keyless {
				key = nil
			}
			rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: key})
			if rep.Intact() || rep.Problems[0].Kind != tt.kind {
				t.Fatalf("want %s first, got %v", tt.kind, rep.Problems)
			}
			// The operation's own check (a timeline's) sees it too, from the seals that hold its records (checked one
			// by one, not linked: with the key, which catches a forged seal).
			if !strings.Contains(tt.name, "approval") {
				one := mustVerify(t, db.DB, audit.VerifyOptions{OperationID: ops[1], PublicKey: pub})
				if one.Intact() {
					t.Fatalf("verify --operation %s: intact after %s", ops[1], tt.name)
				}
			}
			t.Logf("verify: %v", rep.Problems)
		})
	}
}

// exec runs one statement with triggers off, as an attacker who owns the database would.
func exec(t *testing.T, db *gorm.DB, q string, args ...any) {
	t.Helper()
	err := db.Connection(func(conn *gorm.DB) error {
		if err := conn.Exec(`SET session_replication_role = replica`).Error; err != nil {
			return err
		}
		defer conn.Exec(`SET session_replication_role = origin`)
		return conn.Exec(q, args...).Error
	})
	if err != nil {
		t.Fatalf("%s: %v", strings.SplitN(q, "\n", 2)[0], err)
	}
}

// forge rewrites the actor of op's first record and recomputes what covers it: its entry, the hash of its seal's
// entries, and the seal, which finish completes (re-signing with the attacker's own key, or relinking it).
func forge(t *testing.T, db *gorm.DB, op string, finish func(s *auditchain.Seal, mallory *auditchain.Signer)) {
	t.Helper()
	exec(t, db, `UPDATE operation_events SET actor = 'agent:mallory' WHERE `+nth, op, 0)
	var rec struct {
		ID          int64
		AccountID   string
		Type, Actor string
		Detail      string
		FromState   *string
		ToState     *string
		CreatedAt   time.Time
	}
	if err := db.Raw(`SELECT id, account_id, type, actor, detail::text AS detail, from_state, to_state, created_at FROM operation_events WHERE `+nth, op, 0).
		Scan(&rec).Error; err != nil {
		t.Fatal(err)
	}
	hash, err := auditchain.RecordHash(map[string]any{"account_id": rec.AccountID, "actor": rec.Actor, "created_at": auditchain.FormatTime(rec.CreatedAt),
		"detail": json.RawMessage(rec.Detail), "from_state": rec.FromState, "operation_id": op, "to_state": rec.ToState, "type": rec.Type})
	if err != nil {
		t.Fatal(err)
	}
	var row struct {
		Seq                      int64
		PrevHash                 string
		CreatedAt                time.Time
		FirstRecord, RecordCount int64
		Through, Records         string
	}
	if err := db.Raw(`SELECT seq, prev_hash, created_at, first_record, record_count, through::text AS through, records::text AS records
FROM audit_seals WHERE records @> ?::jsonb`, fmt.Sprintf(`[{"table":"operation_events","id":%d}]`, rec.ID)).Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	var entries []auditchain.Entry
	if err := json.Unmarshal([]byte(row.Records), &entries); err != nil {
		t.Fatal(err)
	}
	for i := range entries {
		if entries[i].Table == "operation_events" && entries[i].ID == rec.ID {
			entries[i].Hash = hash
		}
	}
	s := auditchain.Seal{Seq: row.Seq, Prev: row.PrevHash, At: row.CreatedAt, First: row.FirstRecord, Count: row.RecordCount}
	if err := json.Unmarshal([]byte(row.Through), &s.Through); err != nil {
		t.Fatal(err)
	}
	if s.Records, err = auditchain.RecordsHash(entries); err != nil {
		t.Fatal(err)
	}
	mallory, err := auditchain.ParseSigningKey(base64.StdEncoding.EncodeToString(make([]byte, 32)))
	if err != nil {
		t.Fatal(err)
	}
	finish(&s, mallory)
	raw, _ := json.Marshal(entries)
	exec(t, db, `UPDATE audit_seals SET records = ?::jsonb, records_hash = ?, prev_hash = ?, hash = ?, signature = ? WHERE seq = ?`,
		string(raw), s.Records, s.Prev, s.Hash, s.Signature, s.Seq)
}

// TestBacklogIsSealedInBatches gives the sequencer more records than one seal holds: one tick of Run seals them
// all, in seals of at most MaxSealRecords records each, chained one after another.
func TestBacklogIsSealedInBatches(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ops := history(t, db.DB, 1)
	backlog := audit.MaxSealRecords + 50
	if err := db.Exec(`INSERT INTO operation_events (operation_id, account_id, type, actor) SELECT ?, 'acct_a', 'observed', 'system:test' FROM generate_series(1, ?)`,
		ops[0], backlog).Error; err != nil {
		t.Fatal(err)
	}
	const interval = 3 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&audit.Sequencer{DB: db.Pool, Interval: interval}).Run(ctx)
	}()
	type row struct {
		RecordCount int64
		CreatedAt   time.Time
	}
	var sealed []row
	total := int64(backlog + 3 + 3)
	poll.Until(t, "every record sealed", func() bool {
		sealed = nil
		if err := db.Raw(`SELECT record_count, created_at FROM audit_seals ORDER BY seq`).Scan(&sealed).Error; err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, s := range sealed {
			n += s.RecordCount
		}
		return n >= total
	})
	cancel()
	<-done
	if len(sealed) < 2 || sealed[0].RecordCount != audit.MaxSealRecords {
		t.Fatalf("seals %+v; want the first of %d records", sealed, audit.MaxSealRecords)
	}
	var n int64
	for _, s := range sealed {
		n += s.RecordCount
	}
	if n != total {
		t.Fatalf("the seals hold %d records; want %d", n, total)
	}
	rep := mustVerify(t, db.DB, audit.VerifyOptions{})
	if !rep.Intact() || rep.Sealed != int(total) || rep.Seals != len(sealed) {
		t.Errorf("verify: %+v", rep)
	}
}

// TestLateCommitIsSealedLater holds a transaction open, with a record in it, across seal runs: the records
// committed after it began wait with it (their transactions have higher ids), everything before is sealed, and
// once it commits, its record and theirs are sealed and verify; none is skipped.
func TestLateCommitIsSealedLater(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	ops := history(t, db.DB, 2)
	s := &audit.Sequencer{DB: db.Pool}

	late := db.DB.Begin()
	t.Cleanup(func() { late.Rollback() }) // a failed test must not hold sealing back for the others
	if err := opstatus.Append(ctx, database.SQL(late), "acct_a", ops[0], "observed", "system:late", nil); err != nil {
		t.Fatal(err)
	}
	if err := opstatus.Append(ctx, db.Pool, "acct_a", ops[1], "observed", "system:after", nil); err != nil {
		t.Fatal(err)
	}
	// Everything written before the open transaction is sealed, however long other transactions on the server
	// hold sealing back.
	poll.Until(t, "the records written before the open transaction sealed", func() bool {
		if _, err := s.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		var unsealed int64
		db.Raw(`SELECT (SELECT count(*) FROM operation_events e WHERE actor NOT IN ('system:late', 'system:after') AND NOT EXISTS (
    SELECT 1 FROM audit_seals s WHERE s.records @> jsonb_build_array(jsonb_build_object('table', 'operation_events', 'id', e.id))))
  + (SELECT count(*) FROM approval_events e WHERE NOT EXISTS (
    SELECT 1 FROM audit_seals s WHERE s.records @> jsonb_build_array(jsonb_build_object('table', 'approval_events', 'id', e.id))))`).Scan(&unsealed)
		return unsealed == 0
	})
	var early int64
	db.Raw(`SELECT count(*) FROM operation_events e WHERE actor IN ('system:late', 'system:after') AND EXISTS (
    SELECT 1 FROM audit_seals s WHERE s.records @> jsonb_build_array(jsonb_build_object('table', 'operation_events', 'id', e.id)))`).Scan(&early)
	if early != 0 {
		t.Fatalf("%d records sealed while a transaction older than them is open: the open one's record could be skipped", early)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{}); !rep.Intact() || rep.Unsealed != 1 {
		t.Fatalf("the record committed after the open transaction began is reported unsealed: %+v", rep)
	}
	if err := late.Commit().Error; err != nil {
		t.Fatal(err)
	}
	testdb.SealAll(t, s)
	rep := mustVerify(t, db.DB, audit.VerifyOptions{})
	if !rep.Intact() || rep.Unsealed != 0 || rep.Records != 2*3+3+2 || rep.Sealed != rep.Records {
		t.Fatalf("after the late commit: %+v", rep)
	}
	var order []string
	db.Raw(`SELECT e->>'subject' FROM audit_seals s, jsonb_array_elements(s.records) e
WHERE (e->>'id')::bigint IN (SELECT id FROM operation_events WHERE actor IN ('system:late', 'system:after')) ORDER BY s.seq`).Scan(&order)
	if len(order) != 2 || order[0] != ops[0] || order[1] != ops[1] {
		t.Fatalf("sealed in order %v; want the late transaction's record (%s) first: it began first", order, ops[0])
	}
}

// TestTwoSequencersSealEachRecordOnce races two sequencers (two replicas) against writers: every record ends in
// exactly one seal, and the seals form one chain.
func TestTwoSequencersSealEachRecordOnce(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	ops := history(t, db.DB, 4)
	a, b := &audit.Sequencer{DB: db.Pool}, &audit.Sequencer{DB: db.Pool}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sealErr atomic.Value
	for _, s := range []*audit.Sequencer{a, b} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.RunOnce(ctx); err != nil {
					sealErr.Store(err)
					return
				}
			}
		})
	}
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Go(func() {
			for i := range 50 {
				if err := opstatus.Append(ctx, db.Pool, "acct_a", ops[(w+i)%len(ops)], "observed", "system:test", map[string]any{"w": w, "i": i}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	wg.Wait()
	if err, _ := sealErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	testdb.SealAll(t, a)
	var counts struct{ Entries, Distinct, Records int64 }
	db.Raw(`SELECT count(*) AS entries, count(DISTINCT (e->>'table', e->>'id')) AS distinct,
    (SELECT count(*) FROM operation_events) + (SELECT count(*) FROM approval_events) AS records
FROM audit_seals s, jsonb_array_elements(s.records) e`).Scan(&counts)
	if counts.Entries != counts.Records || counts.Distinct != counts.Records || counts.Records != 3*4+3+200 {
		t.Fatalf("entries %+v: want each of the records sealed exactly once", counts)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{}); !rep.Intact() || rep.Sealed != int(counts.Records) {
		t.Fatalf("verify: %+v", rep)
	}
}

// TestSequencerKilledMidBatch kills the sequencer's connection after it inserted a seal and before its commit,
// and cancels another's context there: neither leaves a seal or anything of one, and the next run seals every
// record once. Not parallel: the failpoint is the process's.
func TestSequencerKilledMidBatch(t *testing.T) {
	db := testdb.Schema(t)
	ctx := context.Background()
	history(t, db.DB, 2)
	s := &audit.Sequencer{DB: db.Pool}

	// runKilled runs s until a run fails, as it must once its records are sealable (other transactions on the
	// server may hold them back a while) and kill stops it before its commit.
	runKilled := func(ctx context.Context, kill func(any)) {
		t.Helper()
		unset := failpoint.Set(audit.FailpointBeforeSealCommit, kill)
		defer unset()
		poll.Until(t, "a run stopped before its commit", func() bool {
			seal, err := s.RunOnce(ctx)
			if seal != nil {
				t.Fatalf("a sequencer stopped before its commit wrote %+v", seal)
			}
			return err != nil
		})
		var n int64
		if db.Raw(`SELECT count(*) FROM audit_seals`).Scan(&n); n != 0 {
			t.Fatalf("%d seals after the stopped run; want none", n)
		}
	}
	runKilled(ctx, func(any) {
		// The backend holding this schema's sequencer lock is the sequencer's.
		if err := db.Exec(`SELECT pg_terminate_backend(l.pid) FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = ? AND l.objid = hashtext(current_schema())::oid
  AND l.pid <> pg_backend_pid()`, audit.SealLockKey).Error; err != nil {
			t.Error(err)
		}
	})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runKilled(cctx, func(any) { cancel() })

	seals := testdb.SealAll(t, s)
	if len(seals) == 0 || seals[0].Seq != 1 {
		t.Fatalf("the next run starts the chain: %+v", seals)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{}); !rep.Intact() || rep.Sealed != 2*3+3 || rep.Unsealed != 0 {
		t.Fatalf("verify: %+v", rep)
	}
}

// TestSealOrderIsNumeric: records are sealed in the numeric order of their transaction ids, also where the text of
// the ids sorts otherwise (9 before 10, as a cluster's ids cross a power of ten). Records written with such ids
// are sealed once each; a sequencer that ordered them as text ended its batch at 9 and sealed the 10 record again
// in the next one. The ids are below any this cluster still runs (initdb alone uses more), so they are sealable
// at once on a fresh cluster too.
func TestSealOrderIsNumeric(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	ops := history(t, db.DB, 1)
	for _, xid := range []string{"10", "9", "100"} {
		err := db.DB.Exec(`INSERT INTO operation_events (operation_id, account_id, type, actor, xid) VALUES (?, 'acct_a', 'observed', 'system:x', ?::xid8)`,
			ops[0], xid).Error
		if err != nil {
			t.Fatal(err)
		}
	}
	s := &audit.Sequencer{DB: db.Pool}
	// Other tests' transactions on the server may hold the sealing of the real records back for a while.
	poll.Until(t, "every record sealed", func() bool {
		if _, err := s.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		rep := mustVerify(t, db.DB, audit.VerifyOptions{})
		if !rep.Intact() {
			t.Fatalf("after sealing records of transactions 9, 10 and 100: %+v; want each sealed once", rep)
		}
		return rep.Unsealed == 0
	})
}
