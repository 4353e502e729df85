package idem

import (
	"context"
	"errors"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// ExternalSteps are the three steps of an effect that leaves the process.
type ExternalSteps struct {
	// Prepare runs in the claim's transaction, after the claim and the Guard: check the resource's state and
	// reserve it (mark an intent capturing, insert a pending refund). An error rolls the claim back and leaves
	// the key free, because nothing has left the process yet.
	Prepare func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error
	// Call performs the effect, outside any transaction, with a context that the caller hanging up does not
	// cancel. Give the other side a key derived from op.ID, so a retry or a reconciler can never cause a second
	// effect. Return an error matching ErrOutcomeUnknown when the answer was lost or late.
	Call func(ctx context.Context, op opstatus.Operation) (any, error)
	// Record writes what Call returned (or the definite error it returned) in one transaction with the stored
	// response and the operation's final state. Reconcilers record through Settle with the same code.
	Record func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, outcome any, callErr error) (Result, error)
}

// DoExternal runs an effect that leaves the process, once per Idempotency-Key: the claim commits first with a
// lease of h.Lease, the effect runs, the result is recorded after. When the effect's answer is lost the
// operation becomes unknown and the caller gets 202 with the operation; the kind's Reconciler settles it later,
// and a retry with the same key then replays the settled result.
func (h *Handler) DoExternal(c *gin.Context, req Request, steps ExternalSteps) {
	cl, ok := h.begin(c, req)
	if !ok {
		return
	}
	lease := time.Now().Add(h.Lease)
	cl.op.LeaseExpiresAt = &lease
	ctx := c.Request.Context()
	err := h.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := h.claim(ctx, tx, cl, req); err != nil {
			return err
		}
		if steps.Prepare == nil {
			return nil
		}
		return steps.Prepare(ctx, tx, cl.op)
	})
	var taken errClaimTaken
	if errors.As(err, &taken) {
		h.answerExisting(c, cl, taken.stored)
		return
	}
	if err != nil {
		h.observe(req.Kind, failureOutcome(err, OutcomeRefused))
		problem.Write(c, err)
		return
	}

	// From here on the claim is committed: whatever happens, the operation exists and nothing may run twice.
	effectCtx := context.WithoutCancel(ctx)
	failpoint.Hit(FailpointBeforeExternalCall)
	outcome, callErr := steps.Call(effectCtx, cl.op)
	failpoint.Hit(FailpointAfterExternalCall)
	if errors.Is(callErr, ErrOutcomeUnknown) {
		h.observe(req.Kind, OutcomeUnknown)
		h.markUnknown(effectCtx, cl, callErr)
		h.answerUnknown(c, cl.principal.AccountID, cl.op.ID)
		return
	}
	resp, err := h.settle(effectCtx, cl, func(ctx context.Context, tx *gorm.DB) (Result, error) {
		return steps.Record(ctx, tx, cl.op, outcome, callErr)
	}, opstatus.EventCompleted, cl.principal.Actor())
	switch {
	case errors.Is(err, ErrAlreadySettled):
		// The recovery worker got there first; answer with what it stored.
		stored, lerr := h.Store.Lookup(effectCtx, h.DB, cl.principal.AccountID, cl.key)
		if lerr != nil {
			h.observe(req.Kind, failureOutcome(lerr, OutcomeUnknown))
			problem.Write(c, lerr)
			return
		}
		h.answerExisting(c, cl, stored)
	case err != nil:
		// The effect happened (or definitely failed) but could not be recorded: the operation keeps its lease and
		// the recovery worker will settle it. A retry with the same key is safe.
		h.log().ErrorContext(effectCtx, "external outcome not recorded", "operation_id", cl.op.ID, "kind", req.Kind, "error", err.Error())
		h.observe(req.Kind, failureOutcome(err, OutcomeUnknown))
		problem.Write(c, err)
	default:
		h.observe(req.Kind, OutcomeCreated)
		h.log().InfoContext(effectCtx, "operation completed", "operation_id", cl.op.ID, "kind", req.Kind,
			"account_id", cl.principal.AccountID, "status", resp.Status)
		writeResponse(c, cl.op.ID, resp, false)
	}
}

func (h *Handler) settle(ctx context.Context, cl call, write func(ctx context.Context, tx *gorm.DB) (Result, error), event, actor string) (Response, error) {
	var (
		resp  Response
		state opstatus.State
	)
	err := h.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res, err := write(ctx, tx)
		if err != nil {
			return err
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
	_, err := opstatus.Transition(ctx, h.DB, cl.op.ID, opstatus.StateUnknown, cl.principal.Actor(),
		opstatus.From(opstatus.StateRunning),
		opstatus.WithEvent("outcome_unknown", cl.withAttempt(map[string]any{"reason": cause.Error()})))
	if err != nil {
		// The lease still runs out and the recovery worker marks it unknown then.
		h.log().WarnContext(ctx, "operation not marked unknown", "operation_id", cl.op.ID, "error", err.Error())
	}
}
