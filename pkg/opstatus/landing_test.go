package opstatus_test

import (
	"context"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
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
	if err := opstatus.Append(ctx, db.Pool, op.AccountID, op.ID, opstore.EventDispatchStarted, "test", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	until, reason, err := opstatus.CallMayLand(ctx, db.Pool, op, now)
	if err != nil || !until.Equal(lease) || reason != "" {
		t.Fatalf("started, lease running: until %v reason %q err %v; want the lease's end", until, reason, err)
	}
	if until, reason, _ := opstatus.CallMayLand(ctx, db.Pool, op, lease.Add(time.Second)); !until.IsZero() || reason != opstore.ReasonLeaseExpired {
		t.Fatalf("after the lease: until %v reason %q; want lease_expired", until, reason)
	}
	if err := opstatus.Append(ctx, db.Pool, op.AccountID, op.ID, opstore.EventDispatchResponseReceived, "test", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if until, reason, _ := opstatus.CallMayLand(ctx, db.Pool, op, now); !until.IsZero() || reason != opstore.EventDispatchResponseReceived {
		t.Fatalf("answered: until %v reason %q; want the call over", until, reason)
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
		if got, err := opstore.KeyPredecessor(ctx, db.Pool, tc.op.AccountID, tc.op.IdempotencyKey, tc.op.ID); err != nil || got != tc.want {
			t.Errorf("predecessor of %s = %q, %v; want %q", tc.op.ID, got, err, tc.want)
		}
	}
}
