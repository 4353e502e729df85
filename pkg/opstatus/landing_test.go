package opstatus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// CallMayLand: while the lease runs and no dispatch record shows the call over, the call may still arrive; an
// answer received, or the lease's end, says it cannot.
func TestCallMayLand(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	now := time.Now()
	lease := now.Add(time.Minute)
	op := create(t, db, opstatus.StateUnknown, &lease)
	if err := opstatus.Append(ctx, db.DB, op.AccountID, op.ID, opstore.EventDispatchStarted, "test", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	until, reason, err := opstatus.CallMayLand(ctx, db.DB, op, now)
	if err != nil || !until.Equal(lease) || reason != "" {
		t.Fatalf("started, lease running: until %v reason %q err %v; want the lease's end", until, reason, err)
	}
	if until, reason, _ := opstatus.CallMayLand(ctx, db.DB, op, lease.Add(time.Second)); !until.IsZero() || reason != opstore.ReasonLeaseExpired {
		t.Fatalf("after the lease: until %v reason %q; want lease_expired", until, reason)
	}
	if err := opstatus.Append(ctx, db.DB, op.AccountID, op.ID, opstore.EventDispatchResponseReceived, "test", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if until, reason, _ := opstatus.CallMayLand(ctx, db.DB, op, now); !until.IsZero() || reason != opstore.EventDispatchResponseReceived {
		t.Fatalf("answered: until %v reason %q; want the call over", until, reason)
	}
}

// Resolve refuses, and records nothing, a decision on a kind of a service the process does not run
// (resolver_elsewhere) and one whose call may still land (call_may_still_land with Retry-After); once the
// lease has ended the same decision is recorded.
func TestResolveWaitsForTheCallAndItsService(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	lease := time.Now().Add(time.Minute)
	op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct", Kind: "payments.capture", State: opstatus.StateUnknown,
		IdempotencyKey: "k", Fingerprint: "fp", LeaseExpiresAt: &lease}
	testdb.CreateOperation(t, db.DB, op)
	d := opstatus.Decision{State: opstatus.StateFailed, Evidence: "nothing at the provider"}
	released := 0
	resolvers := map[string]opstatus.Resolver{"payments.capture": opstatus.ResolverFunc(
		func(context.Context, *gorm.DB, opstatus.Operation, opstatus.Decision) error { released++; return nil })}

	_, err := opstatus.Resolve(ctx, db.DB, "acct", op.ID, "approver:x", d, nil, []string{"tickets"})
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != "resolver_elsewhere" || p.Extensions["service"] != "payments" {
		t.Fatalf("decision in a tickets process: %v; want resolver_elsewhere naming payments", err)
	}
	_, err = opstatus.Resolve(ctx, db.DB, "acct", op.ID, "approver:x", d, resolvers, []string{"tickets"})
	if !errors.As(err, &p) || p.Code != "call_may_still_land" || p.RetryAfter < 1 || released != 0 {
		t.Fatalf("decision while the lease runs: %v (released %d); want call_may_still_land with Retry-After", err, released)
	}
	if err := db.Exec(`UPDATE operations SET lease_expires_at = now() - interval '1 second' WHERE id = ?`, op.ID).Error; err != nil {
		t.Fatal(err)
	}
	got, err := opstatus.Resolve(ctx, db.DB, "acct", op.ID, "approver:x", d, resolvers, nil)
	if err != nil || got.State != opstatus.StateFailed || released != 1 {
		t.Fatalf("decision after the lease: %+v, %v (released %d)", got.State, err, released)
	}
}

// KeyPredecessor names the operation that gave the key up at the end of its lifetime, not one whose claim was
// released before its effect, nor one of another account; the first operation under a key has none.
func TestKeyPredecessor(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	mk := func(account string, state opstatus.State) opstatus.Operation {
		op := opstatus.Operation{ID: opstatus.NewID(), AccountID: account, Kind: "test.kind", State: state, IdempotencyKey: "k", Fingerprint: "fp"}
		testdb.CreateOperation(t, db.DB, op)
		return op
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if err := db.Exec(sql, args...).Error; err != nil {
			t.Fatal(err)
		}
	}
	first := mk("acct", opstatus.StateSucceeded)
	exec(`UPDATE operations SET key_state = NULL, completed_at = now() WHERE id = ?`, first.ID) // pruned after its lifetime
	released := mk("acct", opstatus.StateRunning)
	exec(`UPDATE operations SET key_state = NULL, state = 'cancelled' WHERE id = ?`, released.ID) // released before its effect
	mk("other", opstatus.StateSucceeded)
	again := mk("acct", opstatus.StateRunning)

	for _, tc := range []struct {
		op   opstatus.Operation
		want string
	}{{first, ""}, {released, first.ID}, {again, first.ID}} {
		if got, err := opstore.KeyPredecessor(ctx, database.SQL(db.DB), tc.op.AccountID, tc.op.IdempotencyKey, tc.op.ID); err != nil || got != tc.want {
			t.Errorf("predecessor of %s = %q, %v; want %q", tc.op.ID, got, err, tc.want)
		}
	}
}
