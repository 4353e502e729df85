package opstatus

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"
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
type RecoveryWorker struct {
	DB          *gorm.DB
	Reconcilers map[string]Reconciler
	Interval    time.Duration
	Logger      *slog.Logger
}

const recoveryActor = "system:recovery"

// Run works until ctx ends.
func (w *RecoveryWorker) Run(ctx context.Context) {
	interval := w.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := w.RunOnce(ctx); err != nil && ctx.Err() == nil {
			w.Logger.WarnContext(ctx, "recovery pass failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce expires leases, then offers every unknown operation to its reconciler. It returns how many
// operations it settled (left the unknown state).
func (w *RecoveryWorker) RunOnce(ctx context.Context) (int, error) {
	if _, err := ExpireLeases(ctx, w.DB, time.Now()); err != nil {
		return 0, err
	}
	var rows []operationRow
	err := w.DB.WithContext(ctx).Raw(selectOperation + `WHERE state = 'unknown' ORDER BY updated_at LIMIT 100`).Scan(&rows).Error
	if err != nil {
		return 0, fmt.Errorf("opstatus: list unknown: %w", err)
	}
	settled := 0
	for _, r := range rows {
		op := r.operation()
		rec, ok := w.Reconcilers[op.Kind]
		if !ok {
			continue
		}
		if err := rec.Reconcile(ctx, op); err != nil {
			w.Logger.WarnContext(ctx, "reconcile failed", "operation_id", op.ID, "kind", op.Kind, "error", err.Error())
			continue
		}
		after, err := Get(ctx, w.DB, op.AccountID, op.ID)
		if err == nil && after.State != StateUnknown {
			settled++
			w.Logger.InfoContext(ctx, "operation reconciled", "operation_id", op.ID, "kind", op.Kind, "state", after.State)
		}
	}
	return settled, nil
}

// ExpireLeases moves every queued or running operation whose lease ended before now to unknown, with a
// lease_expired event, and returns them. Nothing is deleted: the operation may well have happened.
func ExpireLeases(ctx context.Context, db *gorm.DB, now time.Time) ([]Operation, error) {
	var rows []operationRow
	err := db.WithContext(ctx).Raw(`
WITH expired AS (
    SELECT id, state FROM operations
    WHERE state IN ('queued', 'running') AND lease_expires_at < ?
    ORDER BY lease_expires_at
    LIMIT 100
    FOR UPDATE SKIP LOCKED
), op AS (
    UPDATE operations o SET state = 'unknown', updated_at = now()
    FROM expired WHERE o.id = expired.id
    RETURNING o.id, o.account_id, o.kind, o.state, o.idempotency_key, o.fingerprint, o.resource_type,
              o.resource_id, o.lease_expires_at, o.created_at, o.updated_at, expired.state AS from_state
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor)
    SELECT id, account_id, ?, from_state, state, ? FROM op
)
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id, lease_expires_at,
       created_at, updated_at FROM op`, now, EventLeaseExpired, recoveryActor).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("opstatus: expire leases: %w", err)
	}
	ops := make([]Operation, len(rows))
	for i, r := range rows {
		ops[i] = r.operation()
	}
	return ops, nil
}
