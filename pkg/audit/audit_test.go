package audit_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
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
		if err := opstatus.Append(ctx, db, op.AccountID, op.ID, opstatus.EventReplayed, "agent:a", detail); err != nil {
			t.Fatal(err)
		}
		if _, err := opstatus.Transition(ctx, db, op.AccountID, op.ID, opstatus.StateSucceeded, "agent:a"); err != nil {
			t.Fatal(err)
		}
		opIDs = append(opIDs, op.ID)
	}
	// An approval requested, approved and used: its own chain, written by the approvals trigger.
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
	rep, err := audit.Verify(context.Background(), db, opt)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestIntactChainsVerify(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	signer, pub := testSigner(t)
	ops := history(t, db.DB, 3)
	w := &audit.CheckpointWorker{DB: db.DB, Signer: signer}
	cp, err := w.RunOnce(context.Background())
	if err != nil || cp == nil {
		t.Fatalf("checkpoint: %v %v", cp, err)
	}
	if len(cp.Heads) != 4 {
		t.Fatalf("the first checkpoint seals 3 operations and 1 approval, got %d heads", len(cp.Heads))
	}
	if again, err := w.RunOnce(context.Background()); err != nil || again != nil {
		t.Fatalf("nothing moved: no checkpoint, got %v %v", again, err)
	}
	if err := opstatus.Append(context.Background(), db.DB, "acct_a", ops[1], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	cp2, err := w.RunOnce(context.Background())
	if err != nil || cp2 == nil || cp2.Seq != 2 || len(cp2.Heads) != 1 || cp2.Heads[0].Chain != ops[1] || cp2.Heads[0].Seq != 4 {
		t.Fatalf("second checkpoint seals only the chain that moved: %+v %v", cp2, err)
	}

	rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub})
	if !rep.Intact() || rep.Chains != 4 || rep.Records != 3*3+1+3 || rep.Checkpoints != 2 {
		t.Fatalf("report %+v", rep)
	}
	rep = mustVerify(t, db.DB, audit.VerifyOptions{OperationID: ops[2], PublicKey: pub})
	if !rep.Intact() || rep.Chains != 1 || rep.Records != 3 {
		t.Fatalf("one operation: %+v", rep)
	}
	// --since: only the second checkpoint and what it sealed, plus chains with records since.
	rep = mustVerify(t, db.DB, audit.VerifyOptions{Since: cp2.At, PublicKey: pub})
	if !rep.Intact() || rep.Checkpoints != 1 || rep.Chains != 1 || rep.Records != 4 {
		t.Fatalf("since the second checkpoint: %+v", rep)
	}
	db.Tampered()
	exec(t, db.DB, `DELETE FROM operation_events WHERE operation_id = ? AND chain_seq = 4`, ops[1])
	if rep = mustVerify(t, db.DB, audit.VerifyOptions{Since: cp2.At, PublicKey: pub}); rep.Intact() || rep.Problems[0].Kind != auditchain.Missing {
		t.Fatalf("since, after deleting the sealed tail: %+v", rep)
	}
}

// TestSQLCanonicalMatchesRFC8785 compares the canonical JSON the triggers hash with the one Go computes.
func TestSQLCanonicalMatchesRFC8785(t *testing.T) {
	t.Parallel()
	tx := testdb.Tx(t)
	for _, doc := range []string{
		`{"b":1,"a":[1,2,{"d":null,"c":true}],"":"x"}`,
		`{"s":"quote \" backslash \\ slash / tab \t nl \n cr \r bs \b ff \f ctl \u0001 \u001f del \u007f é 日本 😀 <&> \u2028"}`,
		`{"keys":{"é":1,"e":2,"E":3,"ea":4,"😀":5,"日":6}}`,
		`{"n":[0,-0,1,-1,9007199254740991,-9007199254740991,1.5,-0.25,1e3,100,1.0,2.50]}`,
		`[]`, `{}`, `"x"`, `null`, `true`,
	} {
		var got string
		if err := tx.Raw(`SELECT audit_canonical(?::jsonb)`, doc).Scan(&got).Error; err != nil {
			t.Fatal(err)
		}
		want, err := auditchain.Canonical(json.RawMessage(doc))
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Errorf("canonical of %s:\n sql %s\n  go %s", doc, got, want)
		}
	}
}

func TestVerifyFindsTampering(t *testing.T) {
	t.Parallel()
	signer, pub := testSigner(t)
	// Each case tampers as an attacker with database access would: triggers off, plain SQL.
	tests := []struct {
		name   string
		tamper func(t *testing.T, db *gorm.DB, ops []string)
		kind   auditchain.Kind
	}{
		{"one field of one event changed", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `UPDATE operation_events SET actor = 'agent:mallory' WHERE operation_id = ? AND chain_seq = 2`, ops[1])
		}, auditchain.Changed},
		{"a middle record deleted", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `DELETE FROM operation_events WHERE operation_id = ? AND chain_seq = 2`, ops[1])
		}, auditchain.Missing},
		{"a whole operation deleted with its records", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `DELETE FROM operation_events WHERE operation_id = ?`, ops[1])
			exec(t, db, `DELETE FROM audit_chain_heads WHERE chain = ?`, ops[1])
			exec(t, db, `DELETE FROM operations WHERE id = ?`, ops[1])
		}, auditchain.Missing},
		{"two records swapped", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `UPDATE operation_events SET id = -id WHERE operation_id = ? AND chain_seq IN (2, 3)`, ops[1])
			exec(t, db, `UPDATE operation_events e SET id = (SELECT -min(o.id) FROM operation_events o WHERE o.operation_id = e.operation_id AND o.chain_seq IN (2, 3) AND o.id <> e.id)
WHERE operation_id = ? AND chain_seq IN (2, 3)`, ops[1])
		}, auditchain.OutOfOrder},
		{"the tail of a chain truncated", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `DELETE FROM operation_events WHERE operation_id = ? AND chain_seq = 3`, ops[1])
			exec(t, db, `UPDATE audit_chain_heads h SET seq = 2, hash = e.hash FROM operation_events e
WHERE h.chain = ? AND e.operation_id = h.chain AND e.chain_seq = 2`, ops[1])
		}, auditchain.Missing},
		{"an approval decision rewritten", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `UPDATE approval_events SET actor = 'approver:mallory' WHERE type = 'approved'`)
		}, auditchain.Changed},
		{"a record forged with a recomputed chain, without the signing key", func(t *testing.T, db *gorm.DB, ops []string) {
			forge(t, db, ops[1])
		}, auditchain.BadSignature},
		{"every table truncated", func(t *testing.T, db *gorm.DB, ops []string) {
			exec(t, db, `TRUNCATE operation_events, approval_events, audit_chain_heads`)
		}, auditchain.Missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := testdb.Schema(t)
			db.Tampered()
			ops := history(t, db.DB, 3)
			if _, err := (&audit.CheckpointWorker{DB: db.DB, Signer: signer}).RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub}); !rep.Intact() {
				t.Fatalf("before tampering: %v", rep.Problems)
			}
			tt.tamper(t, db.DB, ops)
			rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub})
			if rep.Intact() || rep.Problems[0].Kind != tt.kind {
				t.Fatalf("want %s first, got %v", tt.kind, rep.Problems)
			}
			// The operation's own check (a timeline's) sees it too, from the checkpoints that sealed it.
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

// forge rewrites the actor of one event of op and recomputes everything that covers it: the chain's hashes, the
// head table and the checkpoint chain, re-signing with the attacker's own key.
func forge(t *testing.T, db *gorm.DB, op string) {
	t.Helper()
	exec(t, db, `UPDATE operation_events SET actor = 'agent:mallory' WHERE operation_id = ? AND chain_seq = 1`, op)
	var rows []struct {
		ID       int64
		ChainSeq int64
		Record   string
	}
	if err := db.Raw(`SELECT id, chain_seq, operation_event_record(e) AS record FROM operation_events e WHERE operation_id = ? ORDER BY chain_seq`, op).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	c := &auditchain.Chain{Name: op}
	for _, r := range rows {
		rec, err := c.Append(json.RawMessage(r.Record))
		if err != nil {
			t.Fatal(err)
		}
		exec(t, db, `UPDATE operation_events SET prev_hash = ?, hash = ? WHERE id = ?`, rec.Prev, rec.Hash, r.ID)
	}
	head := c.Head()
	exec(t, db, `UPDATE audit_chain_heads SET hash = ? WHERE chain = ?`, head.Hash, op)
	var cp struct {
		Heads string
	}
	if err := db.Raw(`SELECT heads::text AS heads FROM audit_checkpoints WHERE seq = 1`).Scan(&cp).Error; err != nil {
		t.Fatal(err)
	}
	var heads []auditchain.Head
	if err := json.Unmarshal([]byte(cp.Heads), &heads); err != nil {
		t.Fatal(err)
	}
	for i := range heads {
		if heads[i].Chain == op {
			heads[i] = head
		}
	}
	mallory, err := auditchain.ParseSigningKey(base64.StdEncoding.EncodeToString(make([]byte, 32)))
	if err != nil {
		t.Fatal(err)
	}
	var cpAt struct{ T string }
	if err := db.Raw(`SELECT audit_time(created_at) AS t FROM audit_checkpoints WHERE seq = 1`).Scan(&cpAt).Error; err != nil {
		t.Fatal(err)
	}
	when, err := time.Parse(auditchain.TimeFormat, cpAt.T)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := auditchain.NextCheckpoint(nil, when, heads, mallory)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(forged.Heads)
	exec(t, db, `UPDATE audit_checkpoints SET heads = ?::jsonb, hash = ?, signature = ? WHERE seq = 1`, string(raw), forged.Hash, forged.Signature)
}

// TestCheckpointBacklogIsSealedInBatches gives the worker more moved chains than one checkpoint seals: one tick
// of Run seals them all (the two checkpoints are written well within one interval of each other), in
// checkpoints of at most MaxCheckpointHeads heads each, chained one after another.
func TestCheckpointBacklogIsSealedInBatches(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	db.Tampered() // heads without records: only the checkpoints are under test here
	backlog := audit.MaxCheckpointHeads + 50
	const interval = 3 * time.Second
	exec(t, db.DB, `INSERT INTO audit_chain_heads (account_id, chain, seq, hash, prev_hash)
SELECT 'acct_a', 'op_backlog_' || g, 1, md5(g::text) || md5(g::text), repeat('0', 64) FROM generate_series(1, ?) g`, backlog)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&audit.CheckpointWorker{DB: db.DB, Interval: interval}).Run(ctx)
	}()
	type row struct {
		Heads     int
		CreatedAt time.Time
	}
	var sealed []row
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		sealed = nil
		if err := db.Raw(`SELECT jsonb_array_length(heads) AS heads, created_at FROM audit_checkpoints ORDER BY seq`).Scan(&sealed).Error; err != nil {
			t.Fatal(err)
		}
		if len(sealed) >= 2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	if len(sealed) != 2 || sealed[0].Heads != audit.MaxCheckpointHeads || sealed[1].Heads != 50 {
		t.Fatalf("checkpoints sealed %+v; want %d heads, then 50", sealed, audit.MaxCheckpointHeads)
	}
	if gap := sealed[1].CreatedAt.Sub(sealed[0].CreatedAt); gap > interval/2 {
		t.Errorf("the second checkpoint came %v after the first: the backlog waited for the next tick (%v)", gap, interval)
	}
	rep := mustVerify(t, db.DB, audit.VerifyOptions{})
	for _, p := range rep.Problems {
		if p.Chain == auditchain.CheckpointChain {
			t.Errorf("the checkpoints' own chain: %+v", p)
		}
	}
	if rep.Checkpoints != 2 {
		t.Errorf("verify checked %d checkpoints; want 2", rep.Checkpoints)
	}
}

// TestCheckpointDoesNotHoldWriters: a record appended to a chain while a checkpoint is being written (here from
// inside it, between reading the heads and committing) goes through at once, on its own connection with a short
// lock timeout: the checkpoint holds no head while it renders and stores itself. The checkpoint covers the chain
// as it read it, leaves that head unsealed because it moved, and the next checkpoint covers its new state; verify
// finds every chain and checkpoint intact.
func TestCheckpointDoesNotHoldWriters(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ops := history(t, db.DB, 3)
	ctx := context.Background()
	var appendErr error
	w := &audit.CheckpointWorker{DB: db.DB, Now: func() time.Time {
		appendErr = db.DB.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec(`SET LOCAL lock_timeout = '1s'`).Error; err != nil {
				return err
			}
			return opstatus.Append(ctx, tx, "acct_a", ops[1], "observed", "system:test", nil)
		})
		return time.Now()
	}}
	cp, err := w.RunOnce(ctx)
	if err != nil || cp == nil {
		t.Fatalf("checkpoint: %v %v", cp, err)
	}
	if appendErr != nil {
		t.Fatalf("a record appended during the checkpoint: %v; want it written at once", appendErr)
	}
	var covered auditchain.Head
	for _, h := range cp.Heads {
		if h.Chain == ops[1] {
			covered = h
		}
	}
	if len(cp.Heads) != 4 || covered.Seq != 3 {
		t.Fatalf("checkpoint heads %+v; want the 4 chains, %s at seq 3 as read", cp.Heads, ops[1])
	}
	var unsealed []string
	if err := db.Raw(`SELECT chain FROM audit_chain_heads WHERE NOT checkpointed`).Scan(&unsealed).Error; err != nil {
		t.Fatal(err)
	}
	if len(unsealed) != 1 || unsealed[0] != ops[1] {
		t.Fatalf("unsealed heads after the checkpoint: %v; want only %s, which moved", unsealed, ops[1])
	}
	w.Now = nil
	cp2, err := w.RunOnce(ctx)
	if err != nil || cp2 == nil || len(cp2.Heads) != 1 || cp2.Heads[0].Chain != ops[1] || cp2.Heads[0].Seq != 4 {
		t.Fatalf("the next checkpoint covers the moved chain's new head: %+v %v", cp2, err)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{}); !rep.Intact() || rep.Checkpoints != 2 {
		t.Fatalf("verify: %+v", rep)
	}
}
