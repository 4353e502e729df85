package opstatus

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/pkg/clock"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// Reconciler settles operations of one kind whose outcome is unknown, from evidence outside the process (the
// payment provider's record of a downstream idempotency key, a deploy target's marker). It must never repeat the
// effect blindly. An error leaves the operation unknown; the worker tries again on a later pass.
type Reconciler interface {
	Reconcile(ctx context.Context, op Operation) error
}

// ReconcilerFunc adapts a function to Reconciler.
type ReconcilerFunc func(ctx context.Context, op Operation) error

func (f ReconcilerFunc) Reconcile(ctx context.Context, op Operation) error { return f(ctx, op) }

// RecoveryWorker marks operations whose lease expired as unknown and asks the reconciler of their kind to
// settle them. Operations of a kind without a reconciler stay unknown for a person to look at.
//
// A reconciler that fails (the other side is down, or cannot tell yet) is asked again after a backoff that
// doubles from Interval up to 8 x Interval, per operation, so a long outage costs a few lookups a minute, not
// one per pass per operation. A retry of the operation's request still asks at once (idem.Handler.Reconcilers).
type RecoveryWorker struct {
	DB          database.DBTX
	Reconcilers map[string]Reconciler
	Interval    time.Duration
	Logger      *slog.Logger
	// Observer, when set, is told what each reconcile achieved (metrics). Finished operations are reported by
	// whoever records them (idem.Handler.Settle, a service's own store), not here, so none is counted twice.
	Observer Observer
	// Clock is the time leases are judged by (the real time when nil); tests move it.
	Clock *clock.Clock

	mu      sync.Mutex
	backoff map[string]retryAt
}

type retryAt struct {
	failures int
	at       time.Time
}

func (w *RecoveryWorker) interval() time.Duration {
	if w.Interval <= 0 {
		return 5 * time.Second
	}
	return w.Interval
}

// due reports whether operation id may be offered to its reconciler now.
func (w *RecoveryWorker) due(id string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.backoff[id]
	return !ok || !now.Before(b.at)
}

// failed schedules the next attempt for id and returns how many attempts have failed.
func (w *RecoveryWorker) failed(id string, now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.backoff == nil {
		w.backoff = map[string]retryAt{}
	}
	b := w.backoff[id]
	b.failures++
	b.at = now.Add(w.interval() << min(b.failures-1, 3))
	w.backoff[id] = b
	return b.failures
}

func (w *RecoveryWorker) forget(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.backoff, id)
}

const recoveryActor = "system:recovery"

// Run works until ctx ends.
func (w *RecoveryWorker) Run(ctx context.Context) {
	t := time.NewTicker(w.interval())
	defer t.Stop()
	for {
		if _, err := w.RunOnce(ctx); err != nil && ctx.Err() == nil {
			w.log().WarnContext(ctx, "recovery pass failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce expires leases, then offers every unknown operation that is not backing off to its reconciler. It
// returns how many operations it settled (left the unknown state).
func (w *RecoveryWorker) RunOnce(ctx context.Context) (int, error) {
	now := w.Clock.Now()
	if _, err := expireLeases(ctx, w.DB, now); err != nil {
		return 0, err
	}
	rows, err := opstore.ListUnknown(ctx, w.DB, 100)
	if err != nil {
		return 0, err
	}
	settled := 0
	for _, r := range rows {
		op := operation(r)
		rec, ok := w.Reconcilers[op.Kind]
		if !ok || !w.due(op.ID, now) {
			continue
		}
		if err := rec.Reconcile(ctx, op); err != nil {
			observeReconciled(w.Observer, op.Kind, ReconcileError)
			n := w.failed(op.ID, now)
			w.log().WarnContext(ctx, "reconcile failed", "operation_id", op.ID, "kind", op.Kind, "attempt", n, "error", err.Error())
			continue
		}
		after, err := Get(ctx, w.DB, op.AccountID, op.ID)
		if err != nil {
			continue
		}
		if after.State == StateUnknown {
			observeReconciled(w.Observer, op.Kind, ReconcileStillUnknown)
		} else {
			observeReconciled(w.Observer, op.Kind, ReconcileSettled)
			w.forget(op.ID)
			settled++
			w.log().InfoContext(ctx, "operation reconciled", "operation_id", op.ID, "kind", op.Kind, "state", after.State)
		}
	}
	return settled, nil
}

// expireLeases moves every queued or running operation whose lease ended before now to unknown, with a
// lease_expired event, and returns them. Nothing is deleted: the operation may well have happened. When the
// attempt that claimed the operation has no attempt record yet (an external effect whose process died after the
// claim), the lease_expired event is that record: its attempt_id, outcome unknown, reason lease_expired.
func expireLeases(ctx context.Context, db database.DBTX, now time.Time) ([]Operation, error) {
	rows, err := opstore.ExpireLeases(ctx, db, now, opstore.EventLeaseExpired, recoveryActor, opstore.ReasonLeaseExpired)
	if err != nil {
		return nil, err
	}
	ops := make([]Operation, len(rows))
	for i, r := range rows {
		ops[i] = operation(r)
	}
	return ops, nil
}

// log is the Logger, or a logger that discards when it is nil.
func (w *RecoveryWorker) log() *slog.Logger {
	if w.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return w.Logger
}
