package idem

// A claim whose owner is gone: an external operation still running, whose claiming process no longer holds the
// owner lock marked on its claim (opstatus.Owner, Handler.Owner) and never started its call (no dispatch_started
// record). Nothing of it can have left a process, so a same-key retry releases it at once, as releaseUnsent
// does, and claims the key itself, instead of answering 409 until the lease ends. The release holds the
// operation's row lock, and a call's dispatch_started record is written only while the operation is running
// (opstatus.StartDispatch): an owner that is alive after all (it lost only its lock connection) has its call
// refused, never sent twice.

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// ReasonOwnerGone is the reason of the not_sent event of a claim released because its owner is gone.
const ReasonOwnerGone = "owner_gone"

var errOwnerAlive = errors.New("idem: the claim's owner holds its lock, or its call started")

// releaseOrphan is RunExternal's reclaim (start): it releases s's operation, and reports true, when it is
// running, a is the same request (same fingerprint, a Retry-Of that names one of its attempts, no
// Supersedes-Operation-Id) and its owner is gone (opstatus.OwnerGone, read once without a lock and again under
// the row lock). The not_sent event names this attempt, with its Retry-Of; the new operation this attempt claims
// starts its own lineage.
func (h *Handler) releaseOrphan(ctx context.Context, a *attempt, s stored, undo undoFunc) bool {
	if s.opState != opstatus.StateRunning || !s.running() || s.fingerprint != a.fingerprint || a.lineage.supersedes != "" {
		return false
	}
	// Most retries of a running operation find its owner alive: one read, no lock.
	owner, gone, err := opstatus.OwnerGone(ctx, h.DB, a.op.AccountID, s.operationID)
	if err != nil || !gone {
		return false
	}
	if a.lineage.retryOf != "" {
		if refusal, err := h.checkRetry(ctx, a, s.operationID); err != nil || refusal != nil {
			return false
		}
	}
	op := opstatus.Operation{ID: s.operationID, AccountID: a.op.AccountID, Kind: a.op.Kind, State: opstatus.StateRunning,
		IdempotencyKey: a.key, Fingerprint: s.fingerprint}
	check := func(tx *database.Tx) error {
		b := &pgx.Batch{}
		b.Queue(lockOperationSQL, op.AccountID, op.ID)
		if err := tx.Send(ctx, b); err != nil {
			return err
		}
		// Read after the lock is held, so a dispatch_started committed before it is seen.
		if _, gone, err := opstatus.OwnerGone(ctx, tx.Gorm(), op.AccountID, op.ID); err != nil || !gone {
			return errors.Join(err, errOwnerAlive)
		}
		return nil
	}
	detail := a.lineage.identity(map[string]any{"reason": ReasonOwnerGone, opstatus.ClaimOwner: owner})
	if err := h.release(ctx, op, a.caller.Actor, detail, check, undo); err != nil {
		h.log().InfoContext(ctx, "orphaned claim not released", "operation_id", op.ID, "error", err.Error())
		return false
	}
	h.log().InfoContext(ctx, "claim released: its owner is gone and its call never started", "operation_id", op.ID, "owner", owner)
	a.lineage.retryOf, a.lineage.retryReason = "", ""
	return true
}
