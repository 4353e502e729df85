package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// ExternalSteps are the three steps of an effect that leaves the process; T is the type of the other side's
// answer, so Call and Record agree on it at compile time.
type ExternalSteps[T any] struct {
	// Prepare runs in the claim's transaction, after the claim and the Guard: check the resource's state and
	// reserve it (mark an intent capturing, insert a pending refund). An error rolls the claim back and leaves
	// the key free, because nothing has left the process yet.
	Prepare func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error
	// Call performs the effect, outside any transaction, with a context that the caller hanging up does not
	// cancel. Give the other side a key derived from op.ID, so a retry or a reconciler can never cause a second
	// effect. Return an error matching ErrOutcomeUnknown when the answer was lost or late.
	Call func(ctx context.Context, op opstatus.Operation) (T, error)
	// Record writes what Call returned (or the definite error it returned) in one transaction with the stored
	// response and the operation's final state. Reconcilers record through Settle with the same code. A callErr
	// matching ErrNotSent means Call never ran: Record undoes Prepare's reservation, and its Result is dropped.
	Record func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, outcome T, callErr error) (Result, error)
}

// externalSteps are ExternalSteps with the answer's type erased once, here, so the machinery below is not
// generic: call returns the Record step already bound to what Call returned.
type externalSteps struct {
	prepare func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error
	call    func(ctx context.Context, op opstatus.Operation) (record func(ctx context.Context, tx *gorm.DB) (Result, error), err error)
	unsent  func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error
}

// DoExternal runs an effect that leaves the process, once per Idempotency-Key: the claim commits first with a
// lease of h.Lease counted from its commit, the effect runs, the result is recorded after. When the effect's
// answer is lost the operation becomes unknown and the caller gets 202 with the operation; the kind's Reconciler
// settles it later, and a retry with the same key then replays the settled result. When the effect may have
// happened but the database cannot record it, the caller gets 503 outcome_unknown naming the operation.
//
// It is a function, not a method of Handler, because Go methods cannot take type parameters.
func DoExternal[T any](h *Handler, c *gin.Context, req Request, steps ExternalSteps[T]) {
	h.doExternal(c, req, externalSteps{
		prepare: steps.Prepare,
		call: func(ctx context.Context, op opstatus.Operation) (func(context.Context, *gorm.DB) (Result, error), error) {
			outcome, err := steps.Call(ctx, op)
			return func(ctx context.Context, tx *gorm.DB) (Result, error) { return steps.Record(ctx, tx, op, outcome, err) }, err
		},
		unsent: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error {
			var none T
			_, err := steps.Record(ctx, tx, op, none, ErrNotSent)
			return err
		},
	})
}

func (h *Handler) doExternal(c *gin.Context, req Request, steps externalSteps) {
	cl, ok := h.begin(c, req)
	if !ok {
		return
	}
	if stored, ok := h.findExisting(c.Request.Context(), cl); ok {
		h.answerExisting(c, cl, stored)
		return
	}
	claimStart := time.Now()
	lease := claimStart.Add(h.Lease)
	cl.op.LeaseExpiresAt = &lease
	// The claim does not stop half way when the caller hangs up: a COMMIT cut short by a cancelled context may
	// still have committed, and the operation would be stranded, claimed but never run. It is bounded by the
	// lease instead. Once it commits the operation is the server's to finish, whoever still listens.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), h.Lease)
	defer cancel()
	err := h.inClaim(ctx, cl, req, nil, func(tx *gorm.DB) (*Completion, error) {
		if steps.prepare != nil {
			if err := steps.prepare(ctx, tx, cl.op); err != nil {
				return nil, err
			}
		}
		// The lease is the effect's time, counted from the claim's commit: a claim that waited on a row lock
		// (another request holding the same order) must not hand the effect a lease already spent.
		if time.Since(claimStart) > h.Lease/20 {
			lease = time.Now().Add(h.Lease)
			if _, err := opstatus.ExtendLease(ctx, tx, cl.op.AccountID, cl.op.ID, lease); err != nil {
				return nil, err
			}
		}
		failpoint.Hit(FailpointExternalClaimed, cl.op)
		return nil, nil
	}, nil)
	err = h.readTaken(ctx, cl, err)
	var taken errClaimTaken
	if errors.As(err, &taken) {
		h.answerExisting(c, cl, taken.stored)
		return
	}
	if err != nil && ctx.Err() != nil && !problem.IsStoreUnavailable(err) {
		// The claim outlived its lease (database/sql then reports only that the transaction is done): nothing was
		// sent, and the database was too slow to say whether the claim committed.
		err = fmt.Errorf("%w: the claim took its whole lease: %w", problem.ErrStoreUnavailable, err)
	}
	if err != nil {
		h.observe(req.Kind, failureOutcome(err, OutcomeRefused))
		problem.Write(c, err)
		return
	}

	// From here on the claim is committed: whatever happens, the operation exists and nothing may run twice.
	// Its steps run detached from the caller's connection, bounded by the lease and as long again to record the
	// outcome (the recording refuses to settle twice, so a late one is harmless).
	effectCtx, cancelEffect := context.WithDeadline(context.WithoutCancel(c.Request.Context()), lease.Add(h.Lease))
	defer cancelEffect()
	if left := time.Until(lease); left < h.dispatchMargin() {
		h.observe(req.Kind, OutcomeStoreUnavailable)
		h.releaseUnsent(effectCtx, c, cl, steps, left)
		return
	}
	failpoint.Hit(FailpointBeforeExternalCall)
	record, callErr := steps.call(effectCtx, cl.op)
	failpoint.Hit(FailpointAfterExternalCall)
	if errors.Is(callErr, ErrOutcomeUnknown) {
		h.observe(req.Kind, OutcomeUnknown)
		h.markUnknown(effectCtx, cl, callErr)
		h.answerUnknown(c, cl.principal.AccountID, cl.op.ID)
		return
	}
	resp, err := h.settle(effectCtx, cl, record, opstatus.EventCompleted, cl.principal.Actor())
	switch {
	case errors.Is(err, ErrAlreadySettled):
		// The recovery worker got there first; answer with what it stored. Reading it is not bound by the
		// effect's deadline, which may be spent by now: only the statement timeout bounds it.
		stored, lerr := h.Store.Lookup(context.WithoutCancel(c.Request.Context()), h.DB, cl.principal.AccountID, cl.key)
		if lerr != nil {
			h.observe(req.Kind, OutcomeUnknown)
			problem.Write(c, problem.OutcomeUnknown(cl.op.ID, lerr))
			return
		}
		h.answerExisting(c, cl, stored)
	case err != nil:
		// The effect happened (or definitely failed) but could not be recorded: the operation keeps its lease and
		// the recovery worker will settle it. The caller must hear that it may have happened and retry with the
		// same key only: "nothing was done" would invite a second effect under a new key.
		h.log().ErrorContext(effectCtx, "external outcome not recorded", "operation_id", cl.op.ID, "kind", req.Kind, "error", err.Error())
		h.observe(req.Kind, OutcomeUnknown)
		problem.Write(c, problem.OutcomeUnknown(cl.op.ID, err))
	default:
		h.observe(req.Kind, OutcomeCreated)
		h.log().InfoContext(effectCtx, "operation completed", "operation_id", cl.op.ID, "kind", req.Kind,
			"account_id", cl.principal.AccountID, "status", resp.Status)
		writeResponse(c, cl.op.ID, resp, false)
	}
}

// ErrNotSent is the call error Record gets for an effect that was never sent because too little of the lease
// was left when the claim committed: Record must undo what Prepare reserved; its Result is not stored.
var ErrNotSent = errors.New("idem: the effect was not sent")

// EventNotSent is the operation event of a claim released before its effect was sent.
const EventNotSent = "not_sent"

func (h *Handler) dispatchMargin() time.Duration {
	if h.DispatchMargin > 0 {
		return h.DispatchMargin
	}
	return h.Lease / 4
}

// releaseUnsent gives up an effect before sending it, when the claim's commit took so long that the effect
// could outlive the lease (and the recovery worker would then judge a call still in flight). Nothing has left
// the process, so the claim is released: Prepare's reservation undone, the operation cancelled with a not_sent
// event, the key deleted, so a retry with the same key claims again. If the release cannot be written the
// claim stays and the recovery worker settles it when its lease ends; nothing was sent either way.
func (h *Handler) releaseUnsent(ctx context.Context, c *gin.Context, cl call, steps externalSteps, left time.Duration) {
	err := h.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		moved, err := opstatus.Transition(ctx, tx, cl.op.AccountID, cl.op.ID, opstatus.StateCancelled, cl.principal.Actor(),
			opstatus.From(opstatus.StateRunning), opstatus.WithLease(time.Time{}),
			opstatus.WithEvent(EventNotSent, cl.lineage.identity(map[string]any{"reason": "lease_too_short", "lease_left_ms": left.Milliseconds()})))
		if err != nil {
			return err
		}
		if !moved {
			return ErrAlreadySettled
		}
		if err := steps.unsent(ctx, tx, cl.op); err != nil {
			return err
		}
		return h.Store.Release(ctx, tx, cl.op.AccountID, cl.key, cl.op.ID)
	})
	if err != nil {
		h.log().WarnContext(ctx, "unsent operation not released; the recovery worker settles it", "operation_id", cl.op.ID, "error", err.Error())
	} else {
		h.log().InfoContext(ctx, "effect not sent: too little lease left after the claim", "operation_id", cl.op.ID, "lease_left_ms", left.Milliseconds())
	}
	problem.Write(c, &problem.Error{Code: problem.CodeStoreUnavailable, RetryAfter: 1,
		Detail: "the database was too slow to start this action safely; it was not sent; retry with the same Idempotency-Key"})
}

func (h *Handler) settle(ctx context.Context, cl call, write func(ctx context.Context, tx *gorm.DB) (Result, error), event, actor string) (Response, error) {
	var (
		resp  Response
		state opstatus.State
	)
	err := h.inSettle(ctx, func(tx *gorm.DB) error {
		res, err := write(ctx, tx)
		if err != nil {
			return err
		}
		if cl.lineage.attempt != "" {
			if cl.attemptRecorded, err = attemptRecorded(ctx, tx, cl); err != nil {
				return err
			}
		}
		state = resultState(res)
		resp, err = h.storeResult(ctx, tx, cl, res, event, actor)
		return err
	})
	if err == nil {
		opstatus.ObserveFinished(h.OperationObserver(), cl.op.Kind, state)
	}
	return resp, err
}

// inSettle runs body in the transaction that records an external effect's outcome. With a PipelinedStore its
// BEGIN waits for body's first statement and goes with it (database.PipelinedTx.BeginWithNext), one round trip
// fewer; its COMMIT is sent once body's statements have answered, since the outcome's own statement may find
// the operation settled already (ErrAlreadySettled) and then nothing of body may stay.
func (h *Handler) inSettle(ctx context.Context, body func(tx *gorm.DB) error) error {
	if _, ok := h.Store.(PipelinedStore); !ok {
		return h.DB.WithContext(ctx).Transaction(body)
	}
	t, err := database.BeginPipelined(ctx, h.DB)
	if err != nil {
		return err
	}
	defer t.Close()
	if err := t.BeginWithNext(nil, ""); err != nil {
		return err
	}
	if err := body(t.DB()); err != nil {
		return err
	}
	return t.Commit(ctx, "")
}

// attemptRecorded locks cl's operation and reports whether the attempt that claimed it already has its attempt
// record: the recovery worker writes one when the lease runs out before the outcome is recorded, under the same
// row lock. Two statements: the read takes its snapshot after the lock is held, so it sees a record committed
// by the worker this transaction waited for.
func attemptRecorded(ctx context.Context, tx *gorm.DB, cl call) (bool, error) {
	err := tx.WithContext(ctx).Exec(`SELECT 1 FROM operations WHERE account_id = ? AND id = ? FOR NO KEY UPDATE`,
		cl.op.AccountID, cl.op.ID).Error
	if err != nil {
		return false, fmt.Errorf("idem: lock %s: %w", cl.op.ID, err)
	}
	var found bool
	err = tx.WithContext(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM operation_events
WHERE account_id = ? AND operation_id = ? AND attempt IS NOT NULL AND detail->>'attempt_id' = ?)`,
		cl.op.AccountID, cl.op.ID, cl.lineage.attempt).Scan(&found).Error
	if err != nil {
		return false, fmt.Errorf("idem: attempt record of %s: %w", cl.op.ID, err)
	}
	return found, nil
}

// Settle records the outcome of op, an external operation that is running or unknown, as found by a reconciler:
// write runs in one transaction with the stored response and the move to the result's state, with a reconciled
// event naming actor. Returns ErrAlreadySettled when the outcome was already recorded.
func (h *Handler) Settle(ctx context.Context, op opstatus.Operation, actor string, write func(ctx context.Context, tx *gorm.DB) (Result, error)) error {
	cl := call{key: op.IdempotencyKey, fingerprint: op.Fingerprint, op: op}
	cl.principal.AccountID = op.AccountID
	_, err := h.settle(ctx, cl, write, opstatus.EventReconciled, actor)
	return err
}

func (h *Handler) markUnknown(ctx context.Context, cl call, cause error) {
	// The record carries a reason from a fixed list; the error's own words go to the log only.
	h.log().InfoContext(ctx, "outcome unknown", "operation_id", cl.op.ID, "error", cause.Error())
	_, err := opstatus.Transition(ctx, h.DB, cl.op.AccountID, cl.op.ID, opstatus.StateUnknown, cl.principal.Actor(),
		opstatus.From(opstatus.StateRunning),
		opstatus.WithEvent(opstatus.EventOutcomeUnknown, cl.record(AttemptUnknown, http.StatusAccepted,
			map[string]any{"reason": opstatus.ReasonNoDefiniteAnswer})))
	if err != nil {
		// The lease still runs out and the recovery worker marks it unknown then.
		h.log().WarnContext(ctx, "operation not marked unknown", "operation_id", cl.op.ID, "error", err.Error())
	}
}
