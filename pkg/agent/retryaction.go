package agent

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

// ObsRetryRequested is the observation of someone asking for a needs_human action to be tried again with its
// key (Agent.Retry): who asked, why, and the new attempt budget. The operation opens again.
const ObsRetryRequested = "retry_requested"

// ErrNotRetryable is returned by Retry for a needs_human action that a retry with its key cannot settle, or
// could harm: it says what to do instead.
var ErrNotRetryable = errors.New("agent: not retried")

// RetryRequest is someone asking for a needs_human action to be tried again with its key.
type RetryRequest struct {
	// By names who asked ("os:alice", "mcp:claude-code"); required.
	By string
	// Reason is why, in words (optional, up to MaxEvidence characters).
	Reason string
	// Budget is how many more attempts the operation may make (default Config.Budget; 1 to 100).
	Budget int
}

// Retry takes the needs_human action (or operation) id out of needs_human with the same idempotency key: it
// journals who asked and the new budget (a retry_requested observation, in the hash chain), then drives the
// operation by the retry rule as Do does, looking it up first where the rule says to. It never makes a new key:
// a changed intent, or a key the service forgets, is a new action id that supersedes this one (DoOptions), held
// while this one's outcome is unknown. Refused (ErrNotRetryable, nothing journaled) for an action that waits for
// an approval, is held back for the action it supersedes, has its effect confirmed twice, or whose key the
// service forgets; ErrNotNeedsHuman for one in any other state.
func (a *Agent) Retry(ctx context.Context, id string, r RetryRequest) (Result, error) {
	if r.By == "" {
		return Result{}, fmt.Errorf("%w: a retry names who asked for it", ErrBadArguments)
	}
	for _, f := range []struct {
		name, value string
		max         int
		multiline   bool
	}{{"by", r.By, 255, false}, {"reason", r.Reason, MaxEvidence, true}} {
		if fault := problem.TextFault(f.value, f.multiline); fault != "" {
			return Result{}, fmt.Errorf("%w: a retry's %s %s", ErrBadArguments, f.name, fault)
		}
		if utf8.RuneCountInString(f.value) > f.max {
			return Result{}, fmt.Errorf("%w: a retry's %s is longer than %d characters", ErrBadArguments, f.name, f.max)
		}
	}
	if r.Budget == 0 {
		r.Budget = a.cfg.Budget
	}
	if r.Budget < 1 || r.Budget > 100 {
		return Result{}, fmt.Errorf("%w: a retry's budget is 1 to 100 attempts", ErrBadArguments)
	}
	op, ok := a.Operation(id)
	if !ok {
		return Result{}, fmt.Errorf("%w: no operation or action %q in the journal", ErrUnknownAction, id)
	}
	unlock := a.lockAction(op.ActionID)
	defer unlock()
	a.mu.Lock()
	st, why := op.State(), notRetryable(op, time.Now())
	a.mu.Unlock()
	if st != StateNeedsHuman {
		return a.result(op), fmt.Errorf("%w: action %q is %s", ErrNotNeedsHuman, op.ActionID, st)
	}
	if why != "" {
		return a.result(op), fmt.Errorf("%w: action %q: %s", ErrNotRetryable, op.ActionID, why)
	}
	detail := fmt.Sprintf("retry with the same key asked by %s; budget %d", r.By, r.Budget)
	if r.Reason != "" {
		detail += ": " + r.Reason
	}
	if err := a.record(&Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsRetryRequested,
		DecidedBy: r.By, Budget: r.Budget, Detail: detail, RunID: a.runID, At: a.now()}); err != nil {
		return Result{}, err
	}
	return a.drive(ctx, op, lastApproval(op))
}

// notRetryable says why a needs_human op must not be sent again under its key, or "". The caller holds a.mu.
func notRetryable(op *Operation, now time.Time) string {
	s := op.Settled
	if s == nil {
		return ""
	}
	superseding := "a new key is a new action id that supersedes this one (agent do --supersedes, or supersedes_action_id)"
	switch {
	case s.Code == CodeSupersededUnknown:
		return "it is held while the action it supersedes may or may not have happened: settle that one first, or " +
			"give a person's approval_id (next_step says how); a retry would send it past the hold"
	case s.Code == "approval_required" || s.Code == "approval_invalid":
		return "it waits for a person's approval, not a retry: request_approval, then call it again with approval_id"
	case s.Code == "duplicate_effect_confirmed":
		return "the service found its effect happened more than once: a person corrects it (next_step), nothing is retried"
	case op.IdempotencyKey != "" && keyExpired(op, now):
		return "the service forgets its idempotency key at " + keyExpiry(op).UTC().Format(time.RFC3339) +
			" (less an hour for clock skew): the same request could run a second time. A person checks the operation " +
			"(agent show, agent resolve); " + superseding
	}
	return ""
}

// retryRequestedSince reports whether someone asked for a retry after the attempt ended.
func retryRequestedSince(op *Operation, at *Attempt) bool {
	if at == nil || at.Finished == nil {
		return false
	}
	for _, o := range op.Observations {
		if o.Kind == ObsRetryRequested && o.At >= at.Finished.At {
			return true
		}
	}
	return false
}
