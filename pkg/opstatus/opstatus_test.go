package opstatus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/clock"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

func create(t *testing.T, db *testdb.DB, state opstatus.State, lease *time.Time) opstatus.Operation {
	t.Helper()
	op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct", Kind: "test.kind", State: state,
		IdempotencyKey: "k-" + opstatus.NewID(), Fingerprint: "fp", LeaseExpiresAt: lease}
	testdb.CreateOperation(t, db.DB, op)
	return op
}

func TestTransitionRecordsOneEventPerChange(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	op := create(t, db, opstatus.StateQueued, nil)
	for range 3 {
		if _, err := opstatus.Transition(ctx, db.Pool, op.AccountID, op.ID, opstatus.StateRunning, "worker", opstatus.From(opstatus.StateQueued)); err != nil {
			t.Fatal(err)
		}
	}
	moved, err := opstatus.Transition(ctx, db.Pool, op.AccountID, op.ID, opstatus.StateSucceeded, "worker",
		opstatus.WithResource(opstatus.Resource{Type: "thing", ID: "t1"}), opstatus.WithEvent("finished", map[string]int{"steps": 3}))
	if err != nil || !moved {
		t.Fatalf("moved=%v err=%v", moved, err)
	}
	// A final state is left only when From names it.
	if moved, _ := opstatus.Transition(ctx, db.Pool, op.AccountID, op.ID, opstatus.StateFailed, "worker"); moved {
		t.Fatal("a final operation moved again")
	}
	got, err := opstatus.Get(ctx, db.Pool, "acct", op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != opstatus.StateSucceeded || got.Resource == nil || got.Resource.ID != "t1" {
		t.Fatalf("operation = %+v", got)
	}
	var types []string
	for _, ev := range got.Events {
		types = append(types, ev.Type+":"+string(ev.FromState)+">"+string(ev.ToState))
	}
	want := []string{"claimed:>queued", "state_changed:queued>running", "finished:running>succeeded"}
	if len(types) != len(want) {
		t.Fatalf("events = %v, want %v", types, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("events = %v, want %v", types, want)
		}
	}
}

func TestEventsAreAppendOnly(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	create(t, db, opstatus.StateRunning, nil)
	if err := db.Exec(`UPDATE operation_events SET actor = 'someone else'`).Error; err == nil {
		t.Fatal("an event was updated")
	}
	if err := db.Exec(`DELETE FROM operation_events`).Error; err == nil {
		t.Fatal("an event was deleted")
	}
}

func TestOtherAccountsOperationIsNotFound(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	op := create(t, db, opstatus.StateRunning, nil)
	if _, err := opstatus.Get(context.Background(), db.Pool, "another", op.ID); !errors.Is(err, problem.ErrNotFound) {
		t.Fatalf("err = %v, want not found", err)
	}
	ops, err := opstatus.FindByKey(context.Background(), db.Pool, "another", op.IdempotencyKey)
	if err != nil || len(ops) != 0 {
		t.Fatalf("found %d of another account's operations (%v)", len(ops), err)
	}
}

// TestRecoveryWorkerExpiresLeasesAndReconciles: an expired lease becomes unknown (never deleted), the kind's
// reconciler is asked to settle it, and a reconciler that fails leaves it unknown for the next pass.
func TestRecoveryWorkerExpiresLeasesAndReconciles(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	past, future := time.Now().Add(-time.Second), time.Now().Add(time.Hour)
	expired := create(t, db, opstatus.StateRunning, &past)
	alive := create(t, db, opstatus.StateRunning, &future)
	fails := true
	var asked []string
	clk := &clock.Clock{}
	w := &opstatus.RecoveryWorker{DB: db.Pool, Logger: servicetest.Logger(), Interval: time.Second, Clock: clk,
		Reconcilers: map[string]opstatus.Reconciler{
			"test.kind": opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
				asked = append(asked, op.ID)
				if fails {
					return errors.New("the other side is down")
				}
				_, err := opstatus.Transition(ctx, db.Pool, op.AccountID, op.ID, opstatus.StateSucceeded, "reconciler", opstatus.From(opstatus.StateUnknown))
				return err
			}),
		}}
	if n, err := w.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("first pass settled %d (%v)", n, err)
	}
	got, _ := opstatus.Get(ctx, db.Pool, "acct", expired.ID)
	if got.State != opstatus.StateUnknown || got.Events[len(got.Events)-1].Type != opstore.EventLeaseExpired {
		t.Fatalf("expired operation = %s %v", got.State, got.Events)
	}
	if got, _ := opstatus.Get(ctx, db.Pool, "acct", alive.ID); got.State != opstatus.StateRunning {
		t.Fatalf("an operation with a live lease became %s", got.State)
	}
	// A failed reconcile backs off: a pass within the backoff does not ask again.
	fails = false
	if n, err := w.RunOnce(ctx); err != nil || n != 0 || len(asked) != 1 {
		t.Fatalf("a pass within the backoff settled %d, asked %d times (%v)", n, len(asked), err)
	}
	clk.Advance(time.Second)
	if n, err := w.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("pass after the backoff settled %d (%v)", n, err)
	}
	if len(asked) != 2 || asked[0] != expired.ID || asked[1] != expired.ID {
		t.Fatalf("reconciler asked about %v", asked)
	}
	if got, _ := opstatus.Get(ctx, db.Pool, "acct", expired.ID); got.State != opstatus.StateSucceeded {
		t.Fatalf("after reconcile: %s", got.State)
	}
}

// TestGetBoundsTheEventsItReads: an operation retried more often than MaxEvents is read with its newest
// MaxEvents events and the count of those left out, so a lookup's answer stays bounded however often it was
// retried; its timeline still has them all.
func TestGetBoundsTheEventsItReads(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	op := create(t, db, opstatus.StateRunning, nil)
	for i := range opstatus.MaxEvents + 10 {
		if err := opstatus.Append(ctx, db.Pool, op.AccountID, op.ID, opstore.EventReplayed, "test", map[string]any{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := opstatus.Get(ctx, db.Pool, op.AccountID, op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Events) != opstatus.MaxEvents || got.EventsOmitted != 11 || got.Events[len(got.Events)-1].Type != opstore.EventReplayed {
		t.Fatalf("%d events, %d omitted; want the newest %d and 11 omitted", len(got.Events), got.EventsOmitted, opstatus.MaxEvents)
	}
	tl, err := opstatus.GetTimeline(ctx, db.Pool, op.AccountID, op.ID)
	if err != nil || len(tl.Entries) != opstatus.MaxEvents+11 {
		t.Fatalf("timeline: %d entries, %v; want all %d", len(tl.Entries), err, opstatus.MaxEvents+11)
	}
}
