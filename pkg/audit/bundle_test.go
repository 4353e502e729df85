package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// TestExportHoldsWhatChecksIt exports the whole record, a time range and one operation, and checks each bundle
// with no database: each holds whole chains and the checkpoints covering them, and passes.
func TestExportHoldsWhatChecksIt(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	signer, pub := testSigner(t)
	ops := history(t, db.DB, 3)
	w := &audit.CheckpointWorker{DB: db.DB, Signer: signer}
	cp1, err := w.RunOnce(ctx)
	if err != nil || cp1 == nil {
		t.Fatalf("checkpoint: %v %v", cp1, err)
	}
	if err := opstatus.Append(ctx, db.DB, "acct_a", ops[1], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	cp2, err := w.RunOnce(ctx)
	if err != nil || cp2 == nil {
		t.Fatalf("checkpoint: %v %v", cp2, err)
	}

	export := func(opt audit.ExportOptions) []byte {
		t.Helper()
		opt.PublicKey = signer.PublicKey()
		var buf bytes.Buffer
		if err := audit.Export(ctx, db.DB, opt, &buf); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	verify := func(b []byte, opt audit.BundleOptions) audit.BundleReport {
		t.Helper()
		rep, err := audit.VerifyBundle(bytes.NewReader(b), opt)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	chainsOf := func(b []byte) []string {
		t.Helper()
		var doc struct{ Chains []struct{ Chain string } }
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range doc.Chains {
			names = append(names, c.Chain)
		}
		slices.Sort(names)
		return names
	}

	all := export(audit.ExportOptions{})
	rep := verify(all, audit.BundleOptions{PublicKey: pub, Checkpoint: cp2.Hash})
	if !rep.Intact() || rep.Chains != 4 || rep.Records != 3*3+1+3 || rep.Checkpoints != 2 || rep.KeyFromBundle {
		t.Fatalf("whole record: %+v", rep)
	}
	if rep := verify(all, audit.BundleOptions{}); !rep.Intact() || !rep.KeyFromBundle {
		t.Fatalf("with the bundle's own key: %+v", rep)
	}

	// Since the second checkpoint: it, and the one chain it sealed, whole from seq 1.
	since := export(audit.ExportOptions{Since: cp2.At})
	if rep := verify(since, audit.BundleOptions{PublicKey: pub}); !rep.Intact() || rep.Checkpoints != 1 || rep.Chains != 1 || rep.Records != 4 {
		t.Fatalf("since the second checkpoint: %+v", rep)
	}
	if got := chainsOf(since); !slices.Equal(got, []string{ops[1]}) {
		t.Fatalf("since: chains %v", got)
	}
	// Until the first: that checkpoint, and every chain it sealed.
	until := export(audit.ExportOptions{Until: cp1.At})
	if rep := verify(until, audit.BundleOptions{PublicKey: pub}); !rep.Intact() || rep.Checkpoints != 1 || rep.Chains != 4 {
		t.Fatalf("until the first checkpoint: %+v", rep)
	}
	if rep := verify(until, audit.BundleOptions{PublicKey: pub, Checkpoint: cp2.Hash}); rep.Intact() {
		t.Fatalf("a bundle that stops before the pinned checkpoint passed: %+v", rep)
	}

	// One operation: its chain and its approval's, with the checkpoints from the first that sealed them on.
	one := export(audit.ExportOptions{OperationID: ops[0]})
	rep = verify(one, audit.BundleOptions{PublicKey: pub, Checkpoint: cp2.Hash})
	if !rep.Intact() || rep.Chains != 2 || rep.Records != 6 || rep.Checkpoints != 2 || rep.Operation != ops[0] {
		t.Fatalf("one operation: %+v", rep)
	}
	if got, want := chainsOf(one), []string{"apv_1", ops[0]}; !slices.Equal(got, want) {
		t.Fatalf("one operation: chains %v, want %v", got, want)
	}
	var doc map[string]any
	if err := json.Unmarshal(one, &doc); err != nil {
		t.Fatal(err)
	}
	doc["chains"] = slices.DeleteFunc(doc["chains"].([]any), func(c any) bool { return c.(map[string]any)["chain"] == ops[0] })
	gone, _ := json.Marshal(doc)
	if rep := verify(gone, audit.BundleOptions{PublicKey: pub}); rep.Intact() || rep.Problems[0].Kind != auditchain.Missing || rep.Problems[0].Chain != ops[0] {
		t.Fatalf("the operation's chain deleted from its bundle: %+v", rep)
	}

	var none bytes.Buffer
	if err := audit.Export(ctx, db.DB, audit.ExportOptions{OperationID: "op_missing"}, &none); !errors.Is(err, audit.ErrNoRecords) || none.Len() != 0 {
		t.Fatalf("an unknown operation: %v, wrote %q", err, none.String())
	}
}

// TestVerifyPinnedCheckpoint: the database's checkpoints must start at the first (they are never deleted), and
// include a pinned hash.
func TestVerifyPinnedCheckpoint(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	signer, pub := testSigner(t)
	ops := history(t, db.DB, 2)
	w := &audit.CheckpointWorker{DB: db.DB, Signer: signer}
	if cp, err := w.RunOnce(ctx); err != nil || cp == nil {
		t.Fatalf("checkpoint: %v %v", cp, err)
	}
	if err := opstatus.Append(ctx, db.DB, "acct_a", ops[1], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	cp, err := w.RunOnce(ctx)
	if err != nil || cp == nil {
		t.Fatalf("checkpoint: %v %v", cp, err)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub, Checkpoint: cp.Hash}); !rep.Intact() {
		t.Fatalf("pinned to the last checkpoint: %+v", rep)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub, Checkpoint: "00" + cp.Hash[2:]}); rep.Intact() {
		t.Fatalf("pinned to a checkpoint that is not there: %+v", rep)
	}
	db.Tampered()
	// The first checkpoint and the operation only it sealed: the rest still links.
	exec(t, db.DB, `DELETE FROM audit_checkpoints WHERE seq = 1`)
	exec(t, db.DB, `DELETE FROM operation_events WHERE operation_id = ?`, ops[0])
	exec(t, db.DB, `DELETE FROM audit_chain_heads WHERE chain = ?`, ops[0])
	rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub})
	if rep.Intact() || rep.Problems[0].Chain != auditchain.CheckpointChain || rep.Problems[0].Kind != auditchain.Missing || rep.Problems[0].Seq != 2 {
		t.Fatalf("the first checkpoint deleted: %+v", rep)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub, Since: cp.At}); !rep.Intact() {
		t.Fatalf("since the second checkpoint, the first is not in scope: %+v", rep)
	}
	exec(t, db.DB, `DELETE FROM audit_checkpoints`)
	rep = mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub, Checkpoint: cp.Hash})
	if rep.Intact() || rep.Problems[0].Chain != auditchain.CheckpointChain || rep.Problems[0].Kind != auditchain.Missing {
		t.Fatalf("every checkpoint deleted, pinned: %+v", rep)
	}
}
