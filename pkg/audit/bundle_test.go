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
// with no database: each holds the records and the seals holding them, and passes.
func TestExportHoldsWhatChecksIt(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	signer, pub := testSigner(t)
	ops := history(t, db.DB, 3)
	w := &audit.Sequencer{DB: db.Pool, Signer: signer}
	first := testdb.SealAll(t, w)
	cp1 := first[len(first)-1]
	if err := opstatus.Append(ctx, db.Pool, "acct_a", ops[1], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	cp2 := testdb.SealAll(t, w)[0]

	export := func(opt audit.ExportOptions) []byte {
		t.Helper()
		opt.PublicKey = signer.PublicKey()
		var buf bytes.Buffer
		if err := audit.Export(ctx, db.Pool, opt, &buf); err != nil {
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
	subjectsOf := func(b []byte) []string {
		t.Helper()
		var doc struct{ Records []struct{ Subject string } }
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range doc.Records {
			names = append(names, c.Subject)
		}
		slices.Sort(names)
		return slices.Compact(names)
	}

	all := export(audit.ExportOptions{})
	rep := verify(all, audit.BundleOptions{PublicKey: pub, Seal: cp2.Hash})
	if !rep.Intact() || rep.Subjects != 4 || rep.Records != 3*3+1+3 || rep.Sealed != rep.Records || rep.Seals != len(first)+1 || rep.KeyFromBundle {
		t.Fatalf("whole record: %+v", rep)
	}
	if rep := verify(all, audit.BundleOptions{}); !rep.Intact() || !rep.KeyFromBundle {
		t.Fatalf("with the bundle's own key: %+v", rep)
	}

	// Since the second seal: it, and the one record it holds.
	since := export(audit.ExportOptions{Since: cp2.At})
	if rep := verify(since, audit.BundleOptions{PublicKey: pub}); !rep.Intact() || rep.Seals != 1 || rep.Subjects != 1 || rep.Records != 1 {
		t.Fatalf("since the second seal: %+v", rep)
	}
	if got := subjectsOf(since); !slices.Equal(got, []string{ops[1]}) {
		t.Fatalf("since: subjects %v", got)
	}
	// Until the last of the first seals: those, and every record they hold.
	until := export(audit.ExportOptions{Until: cp1.At})
	if rep := verify(until, audit.BundleOptions{PublicKey: pub}); !rep.Intact() || rep.Seals != len(first) || rep.Subjects != 4 || rep.Records != 12 {
		t.Fatalf("until the first seals: %+v", rep)
	}
	if rep := verify(until, audit.BundleOptions{PublicKey: pub, Seal: cp2.Hash}); rep.Intact() {
		t.Fatalf("a bundle that stops before the pinned seal passed: %+v", rep)
	}

	// One operation: its records and its approval's, with the seals from the first that holds them on.
	one := export(audit.ExportOptions{OperationID: ops[0]})
	rep = verify(one, audit.BundleOptions{PublicKey: pub, Seal: cp2.Hash})
	if !rep.Intact() || rep.Subjects != 2 || rep.Records != 6 || rep.Sealed != 6 || rep.Operation != ops[0] || rep.LastSeal.Hash != cp2.Hash {
		t.Fatalf("one operation: %+v", rep)
	}
	if got, want := subjectsOf(one), []string{"apv_1", ops[0]}; !slices.Equal(got, want) {
		t.Fatalf("one operation: subjects %v, want %v", got, want)
	}
	var doc map[string]any
	if err := json.Unmarshal(one, &doc); err != nil {
		t.Fatal(err)
	}
	doc["records"] = slices.DeleteFunc(doc["records"].([]any), func(c any) bool { return c.(map[string]any)["subject"] == ops[0] })
	gone, _ := json.Marshal(doc)
	if rep := verify(gone, audit.BundleOptions{PublicKey: pub}); rep.Intact() || rep.Problems[0].Kind != auditchain.Missing || rep.Problems[0].Chain != ops[0] {
		t.Fatalf("the operation's records deleted from its bundle: %+v", rep)
	}

	var none bytes.Buffer
	if err := audit.Export(ctx, db.Pool, audit.ExportOptions{OperationID: "op_missing"}, &none); !errors.Is(err, audit.ErrNoRecords) || none.Len() != 0 {
		t.Fatalf("an unknown operation: %v, wrote %q", err, none.String())
	}
}

// TestVerifyPinnedSeal: the database's seals must start at the first (they are never deleted), and include a
// pinned hash.
func TestVerifyPinnedSeal(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	signer, pub := testSigner(t)
	ops := history(t, db.DB, 2)
	w := &audit.Sequencer{DB: db.Pool, Signer: signer}
	first := testdb.SealAll(t, w)
	if err := opstatus.Append(ctx, db.Pool, "acct_a", ops[1], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	last := testdb.SealAll(t, w)[0]
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub, Seal: last.Hash}); !rep.Intact() {
		t.Fatalf("pinned to the last seal: %+v", rep)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub, Seal: "00" + last.Hash[2:]}); rep.Intact() {
		t.Fatalf("pinned to a seal that is not there: %+v", rep)
	}
	db.Tampered()
	// The first seals and the records only they hold: the rest still links.
	exec(t, db.DB, `DELETE FROM audit_seals WHERE seq <= ?`, first[len(first)-1].Seq)
	exec(t, db.DB, `DELETE FROM operation_events WHERE id NOT IN (SELECT (e->>'id')::bigint FROM audit_seals, jsonb_array_elements(records) e)`)
	exec(t, db.DB, `DELETE FROM approval_events`)
	rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub})
	if rep.Intact() || rep.Problems[0].Chain != auditchain.SealChain || rep.Problems[0].Kind != auditchain.Missing || rep.Problems[0].Seq != last.Seq {
		t.Fatalf("the first seals deleted: %+v", rep)
	}
	if rep := mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub, Since: last.At}); !rep.Intact() {
		t.Fatalf("since the last seal, the first are not in scope: %+v", rep)
	}
	exec(t, db.DB, `DELETE FROM audit_seals`)
	rep = mustVerify(t, db.DB, audit.VerifyOptions{PublicKey: pub, Seal: last.Hash})
	if rep.Intact() || rep.Problems[0].Chain != auditchain.SealChain || rep.Problems[0].Kind != auditchain.Missing {
		t.Fatalf("every seal deleted, pinned: %+v", rep)
	}
}
