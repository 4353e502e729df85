package opstatus_test

import (
	"context"
	"errors"
	"testing"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// TestOwnerGoneOnlyWhenItsLockIsFreeAndNoCallStarted: a claim marked with a live owner is not orphaned; once the
// owner closes (its session ends, as when its process dies) it is, until a call of it starts. A call is refused
// its dispatch_started record once the operation is no longer running.
func TestOwnerGoneOnlyWhenItsLockIsFreeAndNoCallStarted(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	owner, err := opstatus.HoldOwner(db.DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	servicetest.Eventually(t, "the owner lock is held", func() bool { return owner.ID() != 0 })
	claim := func() opstatus.Operation {
		op := create(t, db, opstatus.StateRunning, nil)
		if err := opstatus.Append(ctx, db.Pool, op.AccountID, op.ID, opstore.EventClaimed, "test", opstore.Attempt{Owner: owner.ID()}); err != nil {
			t.Fatal(err)
		}
		return op
	}
	gone := func(op opstatus.Operation) bool {
		_, gone, err := opstore.OwnerGone(ctx, db.Pool, op.AccountID, op.ID)
		if err != nil {
			t.Fatal(err)
		}
		return gone
	}
	idle, started, released := claim(), claim(), claim()
	if gone(idle) {
		t.Fatal("a claim of a live owner is called orphaned")
	}
	if err := opstatus.StartDispatch(ctx, db.Pool, started.AccountID, started.ID, "test", map[string]string{"path": "/x"}); err != nil {
		t.Fatal(err)
	}
	owner.Close()
	servicetest.Eventually(t, "the closed owner's claim is orphaned", func() bool { return gone(idle) })
	if gone(started) {
		t.Fatal("a claim whose call started is called orphaned")
	}
	if _, err := opstatus.Transition(ctx, db.Pool, released.AccountID, released.ID, opstatus.StateCancelled, "test"); err != nil {
		t.Fatal(err)
	}
	err = opstatus.StartDispatch(ctx, db.Pool, released.AccountID, released.ID, "test", map[string]string{"path": "/x"})
	if !errors.Is(err, opstatus.ErrNotRunning) {
		t.Fatalf("dispatch of a cancelled operation: %v; want ErrNotRunning", err)
	}
}

// TestCallOverReadsTheNewestDispatchRecord: only an answer received or a call never sent, as the newest dispatch
// record, says the call is over.
func TestCallOverReadsTheNewestDispatchRecord(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	op := create(t, db, opstatus.StateUnknown, nil)
	for _, step := range []struct{ append, want string }{
		{"", ""},
		{opstore.EventDispatchStarted, ""},
		{opstore.EventDispatchSentNoResponse, ""},
		{opstore.EventDispatchStarted, ""},
		{opstore.EventDispatchResponseReceived, opstore.EventDispatchResponseReceived},
		{opstore.EventDispatchStarted, ""},
		{opstore.EventDispatchNotSent, opstore.EventDispatchNotSent},
	} {
		if step.append != "" {
			if err := opstatus.Append(ctx, db.Pool, op.AccountID, op.ID, step.append, "test", nil); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := opstatus.CallOver(ctx, db.Pool, op.AccountID, op.ID); err != nil || got != step.want {
			t.Fatalf("after %q: CallOver = %q, %v; want %q", step.append, got, err, step.want)
		}
	}
}
