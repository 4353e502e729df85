package idem_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemtest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

func TestPostgresStore(t *testing.T) {
	t.Parallel()
	idemtest.Exercise(t, func(t *testing.T) (idem.Store, *gorm.DB) {
		return idem.PostgresStore{}, testdb.Schema(t).DB
	})
}

// TestLookupPlanReadsOneOperation checks the plan PostgreSQL keeps for Lookup's prepared statement (the generic
// plan, made once per connection, here while the tables are nearly empty, as after a deploy on a new database):
// it must reach the key's operation by its whole primary key, never scan the account's operations and filter
// them, which made every retry read all of an account's operations.
func TestLookupPlanReadsOneOperation(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	var plan []string
	err := db.Connection(func(conn *gorm.DB) error {
		if err := conn.Exec(`SET plan_cache_mode = force_generic_plan`).Error; err != nil {
			return err
		}
		defer conn.Exec(`RESET plan_cache_mode`)
		if err := conn.Exec(`PREPARE lookup_plan (text, text) AS ` + idem.LookupSQL).Error; err != nil {
			return err
		}
		defer conn.Exec(`DEALLOCATE lookup_plan`)
		return conn.Raw(`EXPLAIN EXECUTE lookup_plan('acct_a', 'k')`).Scan(&plan).Error
	})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !regexp.MustCompile(`on operations o [^\n]*\n\s*Index Cond: \(\(account_id = k\.account_id\) AND \(id = k\.operation_id\)\)`).MatchString(text) ||
		strings.Contains(text, "Filter") {
		t.Fatalf("Lookup's generic plan does not read the operation by its primary key:\n%s", text)
	}
}

// TestCompleteNewCommitSendsCommitSafely: CompleteNewCommit sends COMMIT without reading its statement's answer.
// A completion for an operation other than the one the key was claimed for writes nothing, and the COMMIT fails
// on the key's foreign key (its operation was never inserted): nothing of the transaction is kept. The same
// completion for the right operation commits the key, the operation, its two events and its chain's head.
func TestCompleteNewCommitSendsCommitSafely(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Schema(t)
	s := idem.PostgresStore{}
	op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct", Kind: "test", State: opstatus.StateRunning,
		IdempotencyKey: "k", Fingerprint: "fp"}
	completion := func(opID string) idem.Completion {
		return idem.Completion{AccountID: "acct", Key: "k", OperationID: opID, Response: idem.Response{Status: 201, Body: []byte(`{}`)},
			State: opstatus.StateSucceeded, Event: opstatus.EventCompleted, Actor: "test"}
	}
	count := func(table string) (n int64) {
		if err := db.DB.Table(table).Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		name     string
		complete opstatus.Operation
		rows     int64
	}{
		{"another operation", opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct", Kind: "test", IdempotencyKey: "k", Fingerprint: "fp"}, 0},
		{"its operation", op, 1},
	} {
		tx, err := database.BeginPipelined(ctx, db.DB)
		if err != nil {
			t.Fatal(err)
		}
		if _, claimed, err := s.ClaimKeyBegin(ctx, tx, op); err != nil || !claimed {
			t.Fatalf("%s: claim: %v, %v", tc.name, claimed, err)
		}
		err = s.CompleteNewCommit(ctx, tx, tc.complete, "test", nil, completion(tc.complete.ID))
		tx.Close()
		if (err == nil) != (tc.rows == 1) {
			t.Fatalf("%s: CompleteNewCommit = %v", tc.name, err)
		}
		for _, table := range []string{"idempotency_keys", "operations", "audit_chain_heads"} {
			if n := count(table); n != tc.rows {
				t.Fatalf("%s: %d rows in %s; want %d", tc.name, n, table, tc.rows)
			}
		}
		if n := count("operation_events"); n != 2*tc.rows {
			t.Fatalf("%s: %d events; want %d", tc.name, n, 2*tc.rows)
		}
	}
}

// TestLookupManyAnswersEachKey: a batched read answers each key asked, in order, with its own account's record:
// the same key name in two accounts is two records, and a key of one account is not found for another.
func TestLookupManyAnswersEachKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Schema(t).DB
	s := idem.PostgresStore{}
	for _, ref := range []idem.KeyRef{{AccountID: "acct_a", Key: "k"}, {AccountID: "acct_b", Key: "k"}, {AccountID: "acct_a", Key: "only_a"}} {
		op := opstatus.Operation{ID: opstatus.NewID(), AccountID: ref.AccountID, Kind: "test", State: opstatus.StateRunning,
			IdempotencyKey: ref.Key, Fingerprint: "fp-" + ref.AccountID + "-" + ref.Key}
		if _, claimed, err := s.Claim(ctx, db, op, "test", nil); err != nil || !claimed {
			t.Fatalf("claim %+v: %v, %v", ref, claimed, err)
		}
	}
	refs := []idem.KeyRef{{AccountID: "acct_b", Key: "only_a"}, {AccountID: "acct_a", Key: "k"}, {AccountID: "acct_a", Key: "missing"},
		{AccountID: "acct_b", Key: "k"}, {AccountID: "acct_a", Key: "only_a"}, {AccountID: "acct_a", Key: "k"}}
	records, found, err := s.LookupMany(ctx, db, refs)
	if err != nil {
		t.Fatal(err)
	}
	wantFound := []bool{false, true, false, true, true, true}
	for i, ref := range refs {
		if found[i] != wantFound[i] {
			t.Fatalf("key %d %+v: found %v; want %v", i, ref, found[i], wantFound[i])
		}
		if !found[i] {
			continue
		}
		r := records[i]
		if r.AccountID != ref.AccountID || r.Key != ref.Key || r.Fingerprint != "fp-"+ref.AccountID+"-"+ref.Key ||
			r.State != idem.KeyRunning || r.OperationState != opstatus.StateRunning {
			t.Fatalf("key %d %+v: record %+v", i, ref, r)
		}
	}
}
