package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// ErrOutcomeUnknown marks an effect whose result did not come back (timeout, dropped connection): it may or may
// not have happened. RunExternal leaves the operation unknown for the reconciler.
var ErrOutcomeUnknown = errors.New("idem: outcome unknown")

// ExternalSteps are the three steps of an effect that leaves the process; T is the type of the other side's
// answer, so Call and Record agree on it at compile time.
type ExternalSteps[T any] struct {
	// Prepare runs in the claim's transaction, after the claim and the Guard: check the resource's state and
	// reserve it (mark an intent capturing, insert a pending refund). An error rolls the claim back and leaves
	// the key free, because nothing has left the process yet.
	Prepare func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error
	// Call performs the effect, outside any transaction, with a context that the caller hanging up does not
	// cancel. Give the other side a key derived from the account and the Idempotency-Key (op.AccountID,
	// op.IdempotencyKey): it survives even a claim lost with its database, so a retry or a reconciler can never
	// cause a second effect. Return an error matching ErrOutcomeUnknown when the answer was lost or late.
	// Before anything leaves, commit the call's start with opstatus.StartDispatch and send nothing if it fails:
	// that refusal is what lets a same-key retry release a claim whose owner is gone (releaseOrphan).
	Call func(ctx context.Context, op opstatus.Operation) (T, error)
	// Record writes what Call returned (or the definite error it returned) in one transaction with the stored
	// response and the operation's final state. Reconcilers record through Settle with the same code. A callErr
	// matching ErrNotSent means Call never ran: Record undoes Prepare's reservation, and its Result is dropped.
	Record func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, outcome T, callErr error) (Result, error)
}

// RunExternal runs an effect that leaves the process, once per Idempotency-Key: the claim commits first with a
// lease of h.Lease counted from its commit, the effect runs, the result is recorded after. When the effect's
// answer is lost the operation becomes unknown and the caller gets 202 with the operation; the kind's Reconciler
// settles it later, and a retry with the same key then replays the settled result. When the effect may have
// happened but the database cannot record it, the caller gets 503 outcome_unknown naming the operation.
//
// It is a function, not a method of Handler, because Go methods cannot take type parameters.
func RunExternal[T any](ctx context.Context, h *Handler, call Call, req Request, steps ExternalSteps[T]) Answer {
	return h.markUnkeyed(call, runExternal(ctx, h, call, req, steps))
}

func runExternal[T any](ctx context.Context, h *Handler, call Call, req Request, steps ExternalSteps[T]) Answer {
	undo := func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error {
		var none T
		_, err := steps.Record(ctx, tx, op, none, ErrNotSent)
		return err
	}
	a, done := h.start(ctx, call, req, func(a *attempt, s stored) bool { return h.releaseOrphan(ctx, a, s, undo) })
	if done != nil {
		return *done
	}
	a.external = true
	if h.Owner != nil {
		a.owner = h.Owner.ID()
	}
	// The claim does not stop half way when the caller hangs up: a COMMIT cut short may still have committed, and
	// the operation would be stranded, claimed but never run. It is bounded by the lease instead. Once it commits
	// the operation is the server's to finish, whoever still listens.
	ctx = context.WithoutCancel(ctx)
	var lease time.Time
	err := traced(ctx, "idem.claim", a, func(ctx context.Context) (err error) {
		lease, err = h.claimExternal(ctx, a, req, steps.Prepare)
		return err
	})
	if opstore.KeyTaken(err) {
		return h.taken(ctx, a, call.Header)
	}
	if err != nil {
		return h.fail(req.Kind, err)
	}
	// From here on the claim is committed: whatever happens, the operation exists and nothing may run twice. Its
	// steps are bounded by the lease and as long again to record the outcome (the recording refuses to settle
	// twice, so a late one is harmless).
	left := lease.Sub(h.Clock.Now())
	ctx, cancel := context.WithTimeout(ctx, left+h.lease())
	defer cancel()
	if left < h.dispatchMargin() {
		h.observe(req.Kind, outcomeStoreUnavailable)
		return h.releaseUnsent(ctx, a, left, undo)
	}
	failpoint.Hit(failpointBeforeExternalCall, a.op)
	var outcome T
	var callErr error
	_ = traced(ctx, "idem.dispatch", a, func(ctx context.Context) error {
		outcome, callErr = steps.Call(ctx, a.op)
		return callErr
	})
	failpoint.Hit(failpointAfterExternalCall)
	if errors.Is(callErr, ErrOutcomeUnknown) {
		return h.markUnknown(ctx, a, callErr)
	}
	var resp response
	err = traced(ctx, "idem.complete", a, func(ctx context.Context) (err error) {
		resp, err = h.settle(ctx, a, opstore.EventCompleted, func(ctx context.Context, tx *gorm.DB) (Result, error) {
			return steps.Record(ctx, tx, a.op, outcome, callErr)
		})
		return err
	})
	return h.recorded(ctx, a, resp, err, h.created(call))
}

// claimExternal commits a's claim with its operation, leased, after the Guard and prepare; it returns the lease.
// The claim itself may take at most a lease: nothing is sent yet, and a database too slow to say whether the
// claim committed is a store failure.
func (h *Handler) claimExternal(ctx context.Context, a *attempt, req Request, prepare func(context.Context, *gorm.DB, opstatus.Operation) error) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, h.lease())
	defer cancel()
	start := h.Clock.Now()
	lease := start.Add(h.lease())
	a.op.LeaseExpiresAt = &lease
	err := func() error {
		tx, err := database.Begin(ctx, h.DB)
		if err != nil {
			return err
		}
		defer tx.Close()
		if err := h.claim(ctx, tx, a, req); err != nil {
			return err
		}
		if prepare != nil {
			if err := prepare(ctx, tx.Gorm(), a.op); err != nil {
				return err
			}
		}
		// The lease is the effect's time, counted from the claim's commit: a claim that waited on a row lock
		// (another request holding the same order) must not hand the effect a lease already spent.
		if now := h.Clock.Now(); now.Sub(start) > h.lease()/20 {
			lease = now.Add(h.lease())
			if _, err := opstatus.ExtendLease(ctx, tx.SQL(), a.op.AccountID, a.op.ID, lease); err != nil {
				return err
			}
		}
		failpoint.Hit(failpointExternalClaimed, a.op)
		return tx.Commit(ctx, nil)
	}()
	if err != nil && ctx.Err() != nil && !opstore.KeyTaken(err) && !problem.IsStoreUnavailable(err) {
		err = fmt.Errorf("%w: the claim took its whole lease: %w", problem.ErrStoreUnavailable, err)
	}
	return lease, err
}

// recorded answers an external effect whose outcome settle tried to record.
func (h *Handler) recorded(ctx context.Context, a *attempt, resp response, err error, created Outcome) Answer {
	switch {
	case errors.Is(err, ErrAlreadySettled):
		// The recovery worker got there first; answer with what it stored.
		s, found, lerr := h.readKey(ctx, a.op.AccountID, a.key)
		if lerr != nil || !found {
			h.observe(a.op.Kind, outcomeUnknown)
			return Answer{Err: problem.OutcomeUnknown(a.op.ID, lerr)}
		}
		return h.existing(ctx, a, s, nil)
	case err != nil:
		// The effect happened (or definitely failed) but could not be recorded: the operation keeps its lease and
		// the recovery worker will settle it. The caller must hear that it may have happened and retry with the
		// same key only: "nothing was done" would invite a second effect under a new key.
		h.log().ErrorContext(ctx, "external outcome not recorded", "operation_id", a.op.ID, "kind", a.op.Kind, "error", err.Error())
		h.observe(a.op.Kind, outcomeUnknown)
		return Answer{Err: problem.OutcomeUnknown(a.op.ID, err)}
	}
	h.observe(a.op.Kind, created)
	h.log().InfoContext(ctx, "operation completed", "operation_id", a.op.ID, "kind", a.op.Kind,
		"account_id", a.op.AccountID, "status", resp.Status)
	return answer(a.op.ID, resp, false)
}

// ErrNotSent is the call error Record gets for an effect that was never sent: too little of the lease was left
// when the claim committed, or a same-key retry releases the claim of a process that is gone (releaseOrphan).
// Record must undo what Prepare reserved; its Result is not stored.
var ErrNotSent = errors.New("idem: the effect was not sent")

// EventNotSent is the operation event of a claim released before its effect was sent.
const eventNotSent = "not_sent"

// releaseUnsent gives up an effect before sending it, when the claim's commit took so long that the effect
// could outlive the lease (and the recovery worker would then judge a call still in flight). Nothing has left
// the process, so the claim is released (release). If the release cannot be written the claim stays and the
// recovery worker settles it when its lease ends; nothing was sent either way.
func (h *Handler) releaseUnsent(ctx context.Context, a *attempt, left time.Duration, undo undoFunc) Answer {
	leftMS := left.Milliseconds()
	detail := a.lineage.identity()
	detail.Reason, detail.LeaseLeftMS = "lease_too_short", &leftMS
	if err := h.release(ctx, a.op, a.caller.Actor, detail, nil, undo); err != nil {
		h.log().WarnContext(ctx, "unsent operation not released; the recovery worker settles it", "operation_id", a.op.ID, "error", err.Error())
	} else {
		h.log().InfoContext(ctx, "effect not sent: too little lease left after the claim", "operation_id", a.op.ID, "lease_left_ms", left.Milliseconds())
	}
	return Answer{Err: &problem.Error{Code: "store_unavailable", RetryAfter: 1,
		Detail: "the database was too slow to start this action safely; it was not sent; retry with the same Idempotency-Key"}}
}

// undoFunc gives back what an external kind's Prepare reserved for op, whose call was never sent: the kind's
// Record step with ErrNotSent.
type undoFunc func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error

// release gives up op's claim before its effect was sent, in one transaction: check (when set) first, under the
// operation's row lock, then the operation cancelled with a not_sent event (detail) and its key given up,
// Prepare's reservation undone, so a retry with the same key claims again. ErrAlreadySettled: op is not running.
func (h *Handler) release(ctx context.Context, op opstatus.Operation, actor string, detail opstore.Attempt,
	check func(*database.Tx) error, undo undoFunc) error {
	tx, err := database.Begin(ctx, h.DB)
	if err != nil {
		return err
	}
	defer tx.Close()
	if check != nil {
		if err := check(tx); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	if err := opstore.QueueRelease(b, op.AccountID, op.ID, opstore.NewEvent{Type: eventNotSent, Actor: actor, Detail: detail}); err != nil {
		return err
	}
	if err := tx.Send(ctx, b); err != nil {
		return err
	}
	if err := undo(ctx, tx.Gorm(), op); err != nil {
		return err
	}
	return tx.Commit(ctx, nil)
}

// settle records an external effect's outcome in one transaction: write (the Record step, or a reconciler's),
// the stored response and the operation's move to the result's state. ErrAlreadySettled: another worker
// recorded it first, and nothing of write stays.
func (h *Handler) settle(ctx context.Context, a *attempt, event string, write func(context.Context, *gorm.DB) (Result, error)) (response, error) {
	tx, err := database.Begin(ctx, h.DB)
	if err != nil {
		return response{}, err
	}
	defer tx.Close()
	res, err := write(ctx, tx.Gorm())
	if err != nil {
		return response{}, err
	}
	// Lock the operation, so the completion moves it from the state it is in (the recovery worker may have marked
	// it unknown), and learn whether the claiming attempt already has its attempt record: the recovery worker
	// writes one, under the same row lock, when the lease runs out before the outcome is recorded.
	lock := &pgx.Batch{}
	opstore.QueueLock(lock, a.op.AccountID, a.op.ID)
	if a.lineage.attempt != "" {
		opstore.QueueAttemptRecorded(lock, a.op.AccountID, a.op.ID, a.lineage.attempt, &a.attemptRecorded)
	}
	if err := tx.Send(ctx, lock); err != nil {
		return response{}, fmt.Errorf("idem: lock %s: %w", a.op.ID, err)
	}
	resp, b, err := h.completion(a, res, event)
	if err != nil {
		return response{}, err
	}
	if err := tx.Commit(ctx, b); err != nil {
		return response{}, err
	}
	opstatus.ObserveFinished(h.OperationObserver(), a.op.Kind, a.op.State)
	return resp, nil
}

// Settle records the outcome of op, an external operation that is running or unknown, as found by a reconciler:
// write runs in one transaction with the stored response and the move to the result's state, with a reconciled
// event naming actor. Returns ErrAlreadySettled when the outcome was already recorded.
func (h *Handler) Settle(ctx context.Context, op opstatus.Operation, actor string, write func(ctx context.Context, tx *gorm.DB) (Result, error)) error {
	a := &attempt{key: op.IdempotencyKey, fingerprint: op.Fingerprint, op: op, caller: Caller{AccountID: op.AccountID, Actor: actor},
		external: true}
	_, err := h.settle(ctx, a, opstore.EventReconciled, write)
	return err
}

// markUnknown records that a's call ended without a definite answer, moving its operation from running to
// unknown with a's attempt record, and answers 202 with the operation read in that transaction. An operation
// another worker moved first (the recovery worker, when the lease ran out) is answered from its key as it is now.
func (h *Handler) markUnknown(ctx context.Context, a *attempt, cause error) Answer {
	// The record carries a reason from a fixed list; the error's own words go to the log only.
	h.log().InfoContext(ctx, "outcome unknown", "operation_id", a.op.ID, "error", cause.Error())
	op, moved, err := h.moveUnknown(ctx, a)
	switch {
	case err != nil:
		// The lease still runs out and the recovery worker marks it unknown then.
		h.log().WarnContext(ctx, "operation not marked unknown", "operation_id", a.op.ID, "error", err.Error())
		h.observe(a.op.Kind, outcomeUnknown)
		return Answer{Err: problem.OutcomeUnknown(a.op.ID, err)}
	case !moved:
		s, found, err := h.readKey(ctx, a.op.AccountID, a.key)
		if err != nil || !found {
			h.observe(a.op.Kind, outcomeUnknown)
			return Answer{Err: problem.OutcomeUnknown(a.op.ID, err)}
		}
		return h.existing(ctx, a, s, nil)
	}
	h.observe(a.op.Kind, outcomeUnknown)
	return unknownAnswer(op)
}

// moveUnknown is markUnknown's transaction: the move, then the operation read while the move holds its row.
func (h *Handler) moveUnknown(ctx context.Context, a *attempt) (op opstatus.Operation, moved bool, err error) {
	tx, err := database.Begin(ctx, h.DB)
	if err != nil {
		return op, false, err
	}
	defer tx.Close()
	moved, err = opstatus.Transition(ctx, tx.SQL(), a.op.AccountID, a.op.ID, opstatus.StateUnknown, a.caller.Actor,
		opstatus.From(opstatus.StateRunning),
		opstatus.WithEvent(opstore.EventOutcomeUnknown, a.record(attemptUnknown, http.StatusAccepted,
			opstore.Attempt{Reason: opstore.ReasonNoDefiniteAnswer})))
	if err != nil || !moved {
		return op, false, err
	}
	if op, err = opstatus.Get(ctx, tx.SQL(), a.op.AccountID, a.op.ID); err != nil {
		return op, false, err
	}
	return op, true, tx.Commit(ctx, nil)
}

// ReasonOwnerGone is the reason of the not_sent event of a claim released because its owner is gone.
const reasonOwnerGone = "owner_gone"

var errOwnerAlive = errors.New("idem: the claim's owner holds its lock, or its call started")

// releaseOrphan is RunExternal's reclaim (start): it releases s's operation, a claim whose owner is gone, and
// reports true, so that a retry claims the key at once instead of answering 409 until the lease ends. It does
// when the operation is running, a is the same request (same fingerprint, a Retry-Of that names one of its
// attempts, no Supersedes-Operation-Id) and the claiming process no longer holds the owner lock marked on its
// claim (opstatus.Owner, Handler.Owner) and never started its call (no dispatch_started record): nothing of it
// can have left a process. That is read once without a lock, and again under the operation's row lock; a call's
// dispatch_started record is written only while the operation is running (opstatus.StartDispatch), so an owner
// alive after all (it lost only its lock connection) has its call refused, never sent twice. The not_sent event
// names this attempt, with its Retry-Of; the new operation this attempt claims starts its own lineage.
func (h *Handler) releaseOrphan(ctx context.Context, a *attempt, s stored, undo undoFunc) bool {
	if s.opState != opstatus.StateRunning || !s.running() || s.fingerprint != a.fingerprint || a.lineage.supersedes != "" {
		return false
	}
	// Most retries of a running operation find its owner alive: one read, no lock.
	owner, gone, err := opstore.OwnerGone(ctx, database.SQL(h.DB), a.op.AccountID, s.operationID)
	if err != nil || !gone {
		return false
	}
	if refusal, err := h.checkRetry(ctx, a, s.operationID); err != nil || refusal != nil {
		return false
	}
	op := opstatus.Operation{ID: s.operationID, AccountID: a.op.AccountID, Kind: a.op.Kind, State: opstatus.StateRunning,
		IdempotencyKey: a.key, Fingerprint: s.fingerprint}
	check := func(tx *database.Tx) error {
		b := &pgx.Batch{}
		opstore.QueueLock(b, op.AccountID, op.ID)
		if err := tx.Send(ctx, b); err != nil {
			return err
		}
		// Read after the lock is held, so a dispatch_started committed before it is seen.
		if _, gone, err := opstore.OwnerGone(ctx, tx.SQL(), op.AccountID, op.ID); err != nil || !gone {
			return errors.Join(err, errOwnerAlive)
		}
		return nil
	}
	detail := a.lineage.identity()
	detail.Reason, detail.Owner = reasonOwnerGone, owner
	if err := h.release(ctx, op, a.caller.Actor, detail, check, undo); err != nil {
		h.log().InfoContext(ctx, "orphaned claim not released", "operation_id", op.ID, "error", err.Error())
		return false
	}
	h.log().InfoContext(ctx, "claim released: its owner is gone and its call never started", "operation_id", op.ID, "owner", owner)
	a.lineage.retryOf, a.lineage.retryReason = "", ""
	return true
}
