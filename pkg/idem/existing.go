package idem

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// verdict is what the handler decided about a request whose key was already claimed: how it is counted, the
// event and attempt record it leaves on the key's operation, and the status of its answer (0: the stored
// response's).
type verdict struct {
	outcome Outcome
	event   string
	record  string
	status  int
}

var (
	verdictReplay     = verdict{outcomeReplayed, opstore.EventReplayed, attemptReplayed, 0}
	verdictConflict   = verdict{outcomeConflict, opstore.EventConflictRejected, attemptConflictRejected, http.StatusUnprocessableEntity}
	verdictInProgress = verdict{outcomeInProgress, opstore.EventRetried, attemptInProgress, http.StatusConflict}
	verdictUnknown    = verdict{outcomeUnknown, opstore.EventRetried, attemptUnknown, http.StatusAccepted}
	verdictBadLineage = verdict{outcomeRefused, opstore.EventAttemptRefused, attemptRefused, http.StatusBadRequest}
	verdictExpired    = verdict{outcomeExpired, opstore.EventRetried, attemptResponseExpired, http.StatusConflict}
)

// existing answers a request whose key was already claimed: a refusal of its lineage headers, or decide's
// verdict. It records the attempt first (durably: a retry whose evidence cannot be written gets an error, never
// an answer the record does not show), then counts it and renders it.
func (h *Handler) existing(ctx context.Context, a *attempt, s stored, header http.Header) Answer {
	refusal, err := h.checkRetry(ctx, a, s.operationID)
	if err != nil {
		return h.fail(a.op.Kind, err)
	}
	if refusal != nil {
		return h.refuseLineage(ctx, a, s.operationID, refusal)
	}
	v, s, early, answered := h.settledVerdict(ctx, a, s, header)
	if answered {
		return early
	}
	rec, status, ans := h.verdictAnswer(v, s)
	if refused, ok := h.recordVerdict(ctx, a, v, s.operationID, status, rec); !ok {
		return refused
	}
	h.observe(a.op.Kind, v.outcome)
	return ans
}

// settledVerdict is decide's verdict on a, whose key is stored as s, and the key it was made on. An unknown
// verdict is answered here (answered, with early, the 202 or an error); unless the operation was settled since
// its key was read: then it is decided again from the key as it is now, without waiting.
func (h *Handler) settledVerdict(ctx context.Context, a *attempt, s stored, header http.Header) (v verdict, latest stored, early Answer, answered bool) {
	v, latest = h.decide(ctx, a, s, header)
	for v == verdictUnknown {
		ans, settled := h.unknown(ctx, a, latest.operationID)
		if !settled {
			return v, latest, ans, true
		}
		now, found, err := h.readKey(ctx, a.op.AccountID, a.key)
		if err == nil && !found {
			err = fmt.Errorf("%w: the key was settled and gone before it could be read", problem.ErrStoreUnavailable)
		}
		if err != nil {
			return v, latest, h.fail(a.op.Kind, err), true
		}
		v, latest = h.decide(ctx, a, now, nil)
	}
	return v, latest, Answer{}, false
}

// verdictAnswer is the answer to verdict v on the key stored as s, the status its attempt record shows, and what
// that record adds to the attempt's.
func (h *Handler) verdictAnswer(v verdict, s stored) (rec opstore.Attempt, status int, ans Answer) {
	opID, state, status := s.operationID, s.opState, v.status
	switch v {
	case verdictConflict:
		rec.PriorFingerprint = s.fingerprint
		ans.Err = problem.New("idempotency_key_reused",
			"this Idempotency-Key was first used for a different request; use a new key for a new action").
			With("operation_id", opID).With("state", state)
	case verdictReplay:
		status = s.response.Status
		ans = answer(opID, s.response, true)
	case verdictExpired:
		ans = Answer{Header: http.Header{headerOperationID: {opID}}, Err: problem.New("idempotency_response_expired",
			"this Idempotency-Key already ran and its response is not stored (expired, or the operation was settled by a person); it is not run again: read the result at the operation or its resource").
			With("operation_id", opID).With("state", state).With("resource", s.resource).
			With("operation_url", "/v1/operations/"+opID)}
	case verdictInProgress:
		rec.State = string(state)
		ans.Err = &problem.Error{
			Code:       "request_in_progress",
			Detail:     "the first request with this Idempotency-Key is still running; retry after Retry-After seconds or send Prefer: wait=N",
			RetryAfter: max(h.RetryAfter, 1),
			Extensions: map[string]any{"operation_id": opID, "state": state},
		}
	}
	return rec, status, ans
}

// recordVerdict records a's attempt, answered with verdict v and status, on operation opID (rec what the verdict
// adds to the record), durably: a retry whose evidence cannot be written gets an error, never an answer the
// record does not show. ok is false when the attempt gets refused instead, the answer it gets then.
func (h *Handler) recordVerdict(ctx context.Context, a *attempt, v verdict, opID string, status int, rec opstore.Attempt) (refused Answer, ok bool) {
	h.init()
	err := h.attempts.Append(ctx, a.op.AccountID, opID, v.event, a.caller.Actor, a.record(v.record, status, rec))
	switch {
	case opstore.AttemptUsed(err) && opID == a.op.ID:
		// The attempt that claimed the operation, answering with what another worker stored, has its record
		// already (the recovery worker's, when its lease ran out): this answer is told without an outcome, so the
		// attempt is not numbered twice.
		err = h.attempts.Append(ctx, a.op.AccountID, opID, v.event, a.caller.Actor, a.lineage.told(status))
	case opstore.AttemptUsed(err):
		// A copy of this attempt (same Attempt-Id) was recorded first, after this one's check.
		return h.refuseLineage(ctx, a, opID, attemptIDUsed()), false
	}
	if err != nil {
		return Answer{Err: err}, false
	}
	return Answer{}, true
}

// refuseLineage records and answers a retry of operation opID refused for its lineage headers. Its record is an
// attempt record, but for an attempt whose Attempt-Id the operation already has: that id stays the other
// attempt's (operation_events_attempt), and the refused one's is kept as repeated_attempt_id.
func (h *Handler) refuseLineage(ctx context.Context, a *attempt, opID string, r *lineageRefusal) Answer {
	detail := a.record(attemptRefused, verdictBadLineage.status, opstore.Attempt{Refusal: r.reason})
	repeated := func() {
		detail.RepeatedAttemptID, detail.AttemptID = detail.AttemptID, ""
	}
	if r.reason == refusalAttemptIDUsed {
		repeated()
	}
	h.init()
	err := h.attempts.Append(ctx, a.op.AccountID, opID, verdictBadLineage.event, a.caller.Actor, detail)
	if opstore.AttemptUsed(err) {
		// Refused for another header, with an Attempt-Id the operation has too.
		repeated()
		err = h.attempts.Append(ctx, a.op.AccountID, opID, verdictBadLineage.event, a.caller.Actor, detail)
	}
	if err != nil {
		return Answer{Err: err}
	}
	h.observe(a.op.Kind, verdictBadLineage.outcome)
	return Answer{Err: r.err}
}

// decide is the verdict on a, whose key is stored as s, and the key it was made on: after waiting (Prefer: wait)
// for a key still running, and asking the reconciler about an unknown operation.
func (h *Handler) decide(ctx context.Context, a *attempt, s stored, header http.Header) (verdict, stored) {
	if s.fingerprint != a.fingerprint {
		return verdictConflict, s
	}
	if wait := h.preferWait(header); wait > 0 && s.running() && h.takeWaiter() {
		s = h.waitFor(ctx, a, s, wait)
		h.waiters <- struct{}{}
	}
	if s.opState == opstatus.StateUnknown {
		s = h.reconcileNow(ctx, a, s)
	}
	switch {
	case s.expired(), !s.completed() && s.opState.Final():
		// A response pruned, or never stored: a person settled the operation (resolution.Resolve). Either way the
		// key ran and never runs again; the operation has the result.
		return verdictExpired, s
	case s.completed():
		return verdictReplay, s
	case s.opState == opstatus.StateUnknown:
		return verdictUnknown, s
	}
	return verdictInProgress, s
}

// running reports whether the key's operation is still at work: no response stored or pruned, and the
// operation neither final nor unknown.
func (s stored) running() bool {
	return !s.completed() && !s.expired() && !s.opState.Final() && s.opState != opstatus.StateUnknown
}

// reconcileNow asks the reconciler of the operation's kind to settle it while the caller waits, so a retry after
// a lost answer learns the outcome as soon as the other side can tell, not at the recovery worker's next pass.
// Whatever the reconciler decides, it decides from the other side's records; it never repeats the effect.
func (h *Handler) reconcileNow(ctx context.Context, a *attempt, s stored) stored {
	op, err := opstatus.Get(ctx, database.SQL(h.DB), a.op.AccountID, s.operationID)
	if err != nil || op.State != opstatus.StateUnknown {
		return s
	}
	rec, ok := h.Reconcilers[op.Kind]
	if !ok {
		return s
	}
	if err := rec.Reconcile(ctx, op); err != nil {
		observeReconciled(h.OperationObserver(), op.Kind, opstatus.ReconcileError)
		h.log().InfoContext(ctx, "retry could not settle the operation yet", "operation_id", op.ID, "error", err.Error())
		return s
	}
	latest, found, err := h.readKey(ctx, a.op.AccountID, a.key)
	if err != nil || !found {
		return s
	}
	result := opstatus.ReconcileSettled
	if latest.opState == opstatus.StateUnknown {
		result = opstatus.ReconcileStillUnknown
	}
	observeReconciled(h.OperationObserver(), op.Kind, result)
	return latest
}

// unknown is the 202 for operation opID, whose outcome was not known when a's key was read: the caller must not
// start a new action, but ask GET /v1/operations/{id} (or retry with the same key) until it settles. The attempt
// is recorded and the operation read in one transaction that holds the operation against a settlement
// (opstore.QueueShareState), so the operation in the answer is unknown and shows this attempt. settled reports
// an operation no longer unknown: nothing was recorded or answered.
func (h *Handler) unknown(ctx context.Context, a *attempt, opID string) (ans Answer, settled bool) {
	op, settled, err := h.recordUnknown(ctx, a, opID, a.record(verdictUnknown.record, verdictUnknown.status, opstore.Attempt{}))
	switch {
	case opstore.AttemptUsed(err) && opID == a.op.ID:
		// The attempt that claimed it has its record already (the recovery worker's): told without an outcome.
		op, settled, err = h.recordUnknown(ctx, a, opID, a.lineage.told(verdictUnknown.status))
	case opstore.AttemptUsed(err):
		return h.refuseLineage(ctx, a, opID, attemptIDUsed()), false
	}
	switch {
	case err != nil:
		// Still unknown, only not recorded now: the same answer without the operation's details.
		h.observe(a.op.Kind, outcomeUnknown)
		return Answer{Err: problem.OutcomeUnknown(opID, err)}, false
	case settled:
		return Answer{}, true
	}
	h.observe(a.op.Kind, verdictUnknown.outcome)
	return unknownAnswer(op), false
}

// unknownAnswer is the 202 that sends op, read unknown in the transaction that recorded the attempt answered.
func unknownAnswer(op opstatus.Operation) Answer {
	// The operation itself, and operation_id as the contract names it in every answer about an operation.
	body, err := json.Marshal(struct {
		opstatus.Operation
		OperationID string `json:"operation_id"`
	}{op, op.ID})
	if err != nil {
		return Answer{Err: err}
	}
	header := http.Header{headerOperationID: {op.ID}, "Location": {"/v1/operations/" + op.ID}, "Retry-After": {"5"},
		"Content-Type": {"application/json"}}
	return Answer{Status: http.StatusAccepted, Header: header, Body: body}
}

// recordUnknown appends detail, a's record, to operation opID and reads the operation, in one transaction that
// holds its row; unless the operation is no longer unknown (settled).
func (h *Handler) recordUnknown(ctx context.Context, a *attempt, opID string, detail opstore.Attempt) (op opstatus.Operation, settled bool, err error) {
	tx, err := database.Begin(ctx, h.DB)
	if err != nil {
		return op, false, err
	}
	defer tx.Close()
	var state string
	b := &pgx.Batch{}
	opstore.QueueShareState(b, a.op.AccountID, opID, &state)
	if err := tx.Send(ctx, b); err != nil {
		return op, false, fmt.Errorf("idem: unknown: %w", err)
	}
	if opstatus.State(state) != opstatus.StateUnknown {
		return op, true, nil
	}
	if err := opstatus.Append(ctx, tx.SQL(), a.op.AccountID, opID, verdictUnknown.event, a.caller.Actor, detail); err != nil {
		return op, false, err
	}
	if op, err = opstatus.Get(ctx, tx.SQL(), a.op.AccountID, opID); err != nil {
		return op, false, err
	}
	return op, false, tx.Commit(ctx, nil)
}

// preferWait parses `Prefer: wait=N` (RFC 7240), capped at MaxWait.
func (h *Handler) preferWait(header http.Header) time.Duration {
	limit := positiveOr(h.MaxWait, 30*time.Second)
	for _, pref := range header.Values("Prefer") {
		for _, part := range strings.Split(pref, ",") {
			name, value, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok || !strings.EqualFold(name, "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSpace(value))
			if err != nil || n <= 0 {
				continue
			}
			return min(time.Duration(n)*time.Second, limit)
		}
	}
	return 0
}

// takeWaiter takes one of MaxWaiters places for a request that asked to wait (Prefer: wait), or reports that
// none is free: that request is answered at once, so waiting callers cannot multiply the database's reads.
func (h *Handler) takeWaiter() bool {
	h.init()
	select {
	case <-h.waiters:
		return true
	default:
		return false
	}
}

// waitFor polls the key, less often as it waits (100 ms, doubling to 1 s), until it completes, its operation
// becomes unknown, or wait passes.
func (h *Handler) waitFor(ctx context.Context, a *attempt, s stored, wait time.Duration) stored {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		select {
		case <-ctx.Done():
			return s
		case <-deadline.C:
			return s
		case <-time.After(pause):
		}
		latest, found, err := h.readKey(ctx, a.op.AccountID, a.key)
		if err != nil || !found {
			return s
		}
		if latest.completed() || latest.expired() || latest.opState == opstatus.StateUnknown {
			return latest
		}
	}
}
