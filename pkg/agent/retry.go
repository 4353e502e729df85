package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/net/http/httpguts"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/tracing"
)

// Retry reasons the journal records: the fixed list the services accept in Retry-Reason (docs/contract.md),
// and the reasons wireReasons maps onto it.
const (
	ReasonConnectionNotEstablished  = "connection_not_established"
	ReasonRateLimited               = "rate_limited"
	ReasonDestination5xx            = "destination_5xx"
	ReasonResponseLostAfterDispatch = "response_lost_after_dispatch"
	ReasonOperatorRequested         = "operator_requested"
	// ReasonRequestInProgress: the service answered 409 request_in_progress, its first request with the key
	// still running; nothing was refused or limited.
	ReasonRequestInProgress = "request_in_progress"
)

// wireReasons maps a reason the services do not list to the nearest one they do, which is what Retry-Reason
// carries (they refuse any other); the journal keeps the precise one. A reason leaves this map when the services
// list it.
var wireReasons = map[string]string{ReasonAcknowledgedLost: ReasonResponseLostAfterDispatch}

// sentReason is the Retry-Reason the attempt carries.
func (a *Attempt) sentReason() string {
	if a.RetryReasonSent != "" {
		return a.RetryReasonSent
	}
	return a.RetryReason
}

// keyExpiryMargin is how long before the service's key_expires_at the agent stops sending a key: the agent's
// and the service's clocks differ, and a send decided now may leave after a backoff. Keys live for days.
const keyExpiryMargin = time.Hour

// step is what the rule decided to do next.
type step struct {
	kind     string // send, lookup, poll, settle
	reason   string // retry reason of a send
	decision string
	wait     time.Duration
	// settle
	state, why, next string
	// code is the settlement's code when the agent, not an answer, decided it.
	code string
	// fromLookup: the settlement rests on a lookup or poll, not on the last answer, whose status and body
	// it does not carry.
	fromLookup bool
	// status and body are, for a settlement from evidence other than the last answer (a worker's), the answer
	// it rests on.
	status int
	body   json.RawMessage
}

// drive runs the retry rule on op until it settles or the rule says to stop.
func (a *Agent) drive(ctx context.Context, op *Operation, approvalID string) (Result, error) {
	deadline := time.Now().Add(a.cfg.MaxWait)
	for {
		if err := ctx.Err(); err != nil {
			return a.result(op), err
		}
		s, err := a.nextStep(ctx, op, deadline)
		if err != nil {
			return a.result(op), err
		}
		if s.kind == "send" && op.budgetLeft() <= 0 {
			s = budgetSpent(op)
		}
		if s.kind == "settle" && s.state == StateRefused {
			// A 404 for a resource an earlier action made may mean the service lost that action (lost.go).
			again, err := a.remakeDependencies(ctx, op)
			if err != nil {
				return a.result(op), err
			}
			if again {
				continue
			}
		}
		if s.kind == "settle" {
			if err := a.settle(op, s); err != nil {
				return Result{}, err
			}
			return a.result(op), nil
		}
		if err := a.act(ctx, op, s, approvalID); err != nil {
			return a.result(op), err
		}
	}
}

// nextStep is the rule's next step for op, a send its expired key cannot make replaced, after waiting what the
// step asks; a wait past deadline ends the call instead (outOfTime).
func (a *Agent) nextStep(ctx context.Context, op *Operation, deadline time.Time) (step, error) {
	s := a.decide(op)
	if s.kind == "send" && op.IdempotencyKey != "" && keyExpired(op, time.Now()) {
		s = a.expiredKey(op)
	}
	if s.kind == "settle" || s.wait <= 0 {
		return s, nil
	}
	if time.Now().Add(s.wait).After(deadline) {
		return a.outOfTime(op), nil
	}
	return s, sleep(ctx, s.wait)
}

// budgetSpent settles an operation the rule would send again with no attempt left: unknown when the service
// holds it so, otherwise a person's.
func budgetSpent(op *Operation) step {
	if lastServerState(op) == "unknown" {
		// The service has the operation and is reconciling it: that, not a spent budget, is where it stands.
		return unknownStep(op, "the service holds it as unknown; the attempt budget is spent")
	}
	next := "the attempt budget is spent and the outcome is not settled: a person must check the operation " +
		"(retrysafe agent show, GET /v1/operations?idempotency_key=) before anything else is sent"
	if neverSent(op) {
		next = "the attempt budget is spent and no attempt left this machine (every one not_sent): nothing happened; " +
			"when the service is reachable, a person sends it again with the same key: retrysafe agent retry ACTION_ID " +
			"(retry_action over MCP); never a new action_id, which would be a second key for one intent"
	}
	return step{kind: "settle", state: StateNeedsHuman, why: "attempt budget spent", next: next}
}

// act takes a step that does not settle: a send, a lookup by key, a poll by id or a converge command's check.
func (a *Agent) act(ctx context.Context, op *Operation, s step, approvalID string) error {
	switch s.kind {
	case "send":
		return a.send(ctx, op, s, approvalID)
	case "lookup":
		return a.lookup(ctx, op)
	case "poll":
		return a.poll(ctx, op)
	case "check":
		return a.checkCommand(ctx, op)
	}
	return nil
}

// outOfTime is the end of a call that waited MaxWait: work the service acknowledged is in progress, an operation
// it holds as unknown is unknown; anything else goes to a person with the evidence.
func (a *Agent) outOfTime(op *Operation) step {
	st := lastServerState(op)
	if st == "unknown" {
		return unknownStep(op, "the service holds it as unknown")
	}
	if st == "queued" || st == "running" {
		return step{kind: "settle", state: StateInProgress, why: "the service is still working on it (" + st + ")",
			next: "the service has the operation and is still working on it: call again with the same action_id, or run resume, to wait for it; never use a new action_id"}
	}
	return step{kind: "settle", state: StateNeedsHuman, why: "no settled answer within the wait",
		next: "no settled answer within the wait: a person must check the service and the operation before anything else is sent"}
}

// unknownStep settles op as unknown: the service itself does not know yet whether it happened.
func unknownStep(op *Operation, why string) step {
	id := op.ServerOperationID()
	return step{kind: "settle", state: StateUnknown, why: why,
		next: fmt.Sprintf("the service holds operation %s as unknown: it may or may not have happened, and the service is "+
			"reconciling it. Call again with the same action_id, or run resume, to learn how it ended; never use a new "+
			"action_id, which could do it a second time. If it stays unknown, a person decides from its timeline "+
			"(retrysafe audit timeline %s)", id, id)}
}

// keyExpiry is when the service forgets op's idempotency key, from the newest answer or observation that said
// (key_expires_at); zero when none did.
func keyExpiry(op *Operation) time.Time {
	var exp, at string
	for _, a := range op.Attempts {
		if r := a.Finished; r != nil && r.KeyExpiresAt != "" && r.At >= at {
			exp, at = r.KeyExpiresAt, r.At
		}
	}
	for _, o := range op.Observations {
		if o.KeyExpiresAt != "" && o.At >= at {
			exp, at = o.KeyExpiresAt, o.At
		}
	}
	t, err := time.Parse(time.RFC3339Nano, exp)
	if err != nil {
		return time.Time{}
	}
	return t
}

// keyExpired reports whether sending op's key at now could run the action a second time: the service said it
// forgets the key by then (within keyExpiryMargin). A service that never said is taken to keep it.
func keyExpired(op *Operation, now time.Time) bool {
	exp := keyExpiry(op)
	return !exp.IsZero() && !now.Before(exp.Add(-keyExpiryMargin))
}

// expiredKey replaces a send the key can no longer make: the operation is settled from a lookup (or a poll) made
// once the key counted as expired, or goes to a person. Nothing is sent again.
func (a *Agent) expiredKey(op *Operation) step {
	exp := keyExpiry(op)
	since := exp.Add(-keyExpiryMargin)
	var last *Observation
	failed := 0
	for _, o := range op.Observations {
		if (o.Kind != ObsLookup && o.Kind != ObsPoll) || recordTime(o.At).Before(since) {
			continue
		}
		last = o
		if o.Found == nil {
			failed++
		}
	}
	expiry := auditchain.FormatTime(exp)
	ask := step{kind: "lookup", decision: "key_expired_look_up"}
	if op.ServerOperationID() != "" {
		ask = step{kind: "poll", decision: "key_expired_poll"}
	}
	person := func(saw string) step {
		return step{kind: "settle", state: StateNeedsHuman, fromLookup: true,
			why: "the idempotency key expired (" + expiry + ") before the outcome was settled",
			next: fmt.Sprintf("the service forgets this action's idempotency key at %s and the agent never sends a key past it: "+
				"the same request could run a second time. The service %s. A person checks the operation (retrysafe agent show, "+
				"GET /v1/operations/{id}) and decides; nothing more is sent for this action", expiry, saw)}
	}
	switch {
	case last == nil:
		return ask
	case last.Found == nil && failed < 3:
		ask.wait = a.backoff(failed)
		return ask
	case last.Found == nil:
		return person("could not be asked about it")
	case !*last.Found:
		return person("has no operation under the key, or under its id, any more")
	}
	switch last.ServerState {
	case "succeeded":
		return step{kind: "settle", state: StateSucceeded, fromLookup: true,
			why: "the service reports the operation succeeded (its key expired " + expiry + ", so it was not sent again)",
			next: fmt.Sprintf("done: nothing more to do for this action. Its key expired, so the agent did not fetch the stored "+
				"answer: read the result from the operation (GET /v1/operations/%s)", last.ServerOperationID)}
	case "failed", "cancelled":
		return step{kind: "settle", state: StateFailed, fromLookup: true,
			why:  "the service reports the operation " + last.ServerState + " (its key expired " + expiry + ")",
			next: "the service says it did not complete: to try again, call with a new action_id"}
	case "queued", "running":
		ask.wait = a.backoff(len(op.Observations))
		return ask
	}
	return person("last reported it " + last.ServerState)
}

// recordTime parses a journal timestamp; an unreadable one is the zero time.
func recordTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// neverSent reports whether every attempt of op is known not to have left the process.
func neverSent(op *Operation) bool {
	for _, at := range op.Attempts {
		if at.Finished == nil || at.Finished.DispatchState != NotSent {
			return false
		}
	}
	return true
}

// lastAttempt is the operation's newest attempt, nil before the first.
func lastAttempt(op *Operation) *Attempt {
	if len(op.Attempts) == 0 {
		return nil
	}
	return op.Attempts[len(op.Attempts)-1]
}

// lastServerState is the newest server state an answer or observation reported.
func lastServerState(op *Operation) string {
	st, at := "", ""
	for _, a := range op.Attempts {
		if a.Finished != nil && a.Finished.ServerState != "" {
			st, at = a.Finished.ServerState, a.Finished.At
		}
	}
	for _, o := range op.Observations {
		if o.ServerState != "" && o.At >= at {
			st, at = o.ServerState, o.At
		}
	}
	return st
}

// observationsSince are the observations recorded after the attempt's end (or start, if it never ended).
func observationsSince(op *Operation, at *Attempt) []*Observation {
	if at == nil {
		return op.Observations
	}
	since := at.At
	if at.Finished != nil {
		since = at.Finished.At
	}
	var out []*Observation
	for _, o := range op.Observations {
		if o.At >= since && o.Kind != ObsChanged && o.Kind != ObsApproval && o.Kind != ObsGrant && o.Kind != ObsRetryRequested {
			out = append(out, o)
		}
	}
	return out
}

// approvedSince reports whether a person's approval arrived after the attempt ended.
func approvedSince(op *Operation, at *Attempt) bool {
	if at.Finished == nil {
		return false
	}
	for _, o := range op.Observations {
		if (o.Kind == ObsApproval || o.Kind == ObsGrant) && o.At >= at.Finished.At {
			return true
		}
	}
	return false
}

// decide is the retry rule: from the last attempt and what was observed since, the next step.
func (a *Agent) decide(op *Operation) step {
	if op.Delegation != nil {
		return a.decideDelegated(op)
	}
	if op.Command != nil {
		return a.decideCommand(op)
	}
	last := lastAttempt(op)
	if last == nil {
		return step{kind: "send", decision: "first_attempt"}
	}
	obs := observationsSince(op, last)
	if approvedSince(op, last) {
		return step{kind: "send", reason: ReasonOperatorRequested, decision: "approval_given_same_key"}
	}
	if s, ok := remakeStep(op, last); ok {
		return s
	}
	backoff := a.backoff(len(op.Attempts) - op.budgetFrom + len(obs))

	res := last.Finished
	if res == nil {
		return a.interrupted(op, last, obs, backoff)
	}
	switch res.DispatchState {
	case NotSent:
		return step{kind: "send", reason: ReasonConnectionNotEstablished, decision: "not_sent_send_again", wait: backoff}
	case SentNoResponse, ExecutionError:
		return a.unknownFate(op, obs, backoff)
	}
	if s, ok := a.answerStep(op, res, obs, backoff); ok {
		return s
	}
	return finalAnswer(op, res)
}

// interrupted decides on an attempt whose process died before it recorded the end: it may have been sent. The
// first run to see it journals so.
func (a *Agent) interrupted(op *Operation, last *Attempt, obs []*Observation, backoff time.Duration) step {
	if !slices.ContainsFunc(obs, func(o *Observation) bool { return o.Kind == ObsInterrupted && o.AttemptID == last.AttemptID }) {
		_ = a.record(Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsInterrupted, AttemptID: last.AttemptID,
			RunID: a.runID, At: a.now(), Detail: "the agent stopped during this attempt: it may have been sent"})
	}
	return a.unknownFate(op, observationsSince(op, last), backoff)
}

// answerStep is the step an answer decides when it says the action happened, is under way, may be asked again,
// or did not happen; ok is false for the answers finalAnswer settles.
func (a *Agent) answerStep(op *Operation, res *AttemptResult, obs []*Observation, backoff time.Duration) (s step, ok bool) {
	retryAfter := time.Duration(res.RetryAfterSeconds) * time.Second
	wait := max(retryAfter, backoff)
	switch {
	case res.Status == http.StatusAccepted || res.Code == "outcome_unknown":
		return a.accepted(op, res, obs, wait), true
	case res.Status >= 200 && res.Status < 300:
		return step{kind: "settle", state: StateSucceeded, why: replayedWord(res), next: "done: nothing more to do for this action"}, true
	case res.Code == "idempotency_response_expired":
		return a.responseExpired(op, res, obs, wait), true
	case res.Code == "request_in_progress":
		return step{kind: "send", reason: ReasonRequestInProgress, decision: "in_progress_same_key_after_retry_after", wait: wait}, true
	case refusedLineage(res):
		// The service refused how the attempt described itself, before deciding anything about the action, which
		// may be done or under way under the key: never a settlement. The next attempt goes without Retry-Of.
		return step{kind: "send", decision: "lineage_refused_same_key_without_retry_of", wait: backoff}, true
	case res.Code == CodeSupersededUnknown:
		return a.supersededUnknownAnswer(op), true
	case res.Status == http.StatusTooManyRequests:
		return step{kind: "send", reason: ReasonRateLimited, decision: "rate_limited_after_retry_after", wait: wait}, true
	case res.Code == "provider_unavailable" || res.Code == "provider_declined":
		return step{kind: "settle", state: StateFailed, why: "the service says it did not happen (" + res.Code + ")",
			next: "the service says it did not happen: to try again, call with a new action_id"}, true
	case res.Status >= 500:
		return step{kind: "send", reason: ReasonDestination5xx, decision: "5xx_same_key_after_backoff", wait: wait}, true
	}
	return step{}, false
}

// finalAnswer settles an answer that is never sent again: a duplicate effect, a reused key or a missing approval
// goes to a person or is refused, and any other refusal is final.
func finalAnswer(op *Operation, res *AttemptResult) step {
	switch res.Code {
	case "duplicate_effect_confirmed":
		return step{kind: "settle", state: StateNeedsHuman, why: "the service found the effect executed more than once",
			next: remediationNext(op.Tool, serverOperationID(op, res)) + " (the body lists the remote ids)"}
	case "idempotency_key_reused":
		return step{kind: "settle", state: StateRefused, why: "the service holds other arguments under this key: a changed intent",
			next: "never retried: a changed intent is a new action_id that supersedes this one"}
	case "approval_required":
		return step{kind: "settle", state: StateNeedsHuman, why: "approval required",
			next: fmt.Sprintf("approval required: call request_approval with {\"for_action\": %q}, have a person approve it, "+
				"then call %s again with the same action_id and arguments plus approval_id", op.ActionID, op.Tool)}
	case CodeGrantInvalid:
		return grantRefused(op, res)
	case "approval_invalid":
		return step{kind: "settle", state: StateNeedsHuman, why: "the approval does not match, expired or was not granted",
			next: fmt.Sprintf("the approval was not accepted: request a new one (request_approval with {\"for_action\": %q}) and call again with its approval_id", op.ActionID)}
	default:
		return step{kind: "settle", state: StateRefused, why: fmt.Sprintf("the service refused it (%d %s)", res.Status, res.Code),
			next: "refused and final: do not retry this action; fix the request and use a new action_id"}
	}
}

// lineageHeaders are the headers in which the agent describes an attempt, not the action: its id, its run, the
// attempt it retries and why. A 400 invalid_request naming one of them (docs/contract.md, "Attempts, lineage and
// evidence") refuses the attempt's description only.
var lineageHeaders = []string{"Attempt-Id", "Agent-Run-Id", "Retry-Of", "Retry-Reason"}

// refusedLineage reports whether res is the service's refusal of one of the attempt's lineage headers.
func refusedLineage(res *AttemptResult) bool {
	if res.Status != http.StatusBadRequest || res.Code != "invalid_request" {
		return false
	}
	var p struct {
		Header string `json:"header"`
	}
	_ = json.Unmarshal(res.Body, &p)
	return slices.Contains(lineageHeaders, p.Header)
}

// remediationNext is the next step of an operation the service settled duplicate_effect_confirmed: never a
// retry, but corrections that name it, which the service links to it and accepts until the duplicate is returned.
// A refund paid twice is not corrected by another refund (docs/payments.md).
func remediationNext(tool, serverOpID string) string {
	if tool == "refund_payment" {
		return "the service's records show this refund was paid out more than once, and its books count every payment; " +
			"nothing is retried and no refund corrects it (the service refuses one, 409 duplicate_refund_not_refundable): " +
			"a person recovers the money through the payment provider or the customer (docs/payments.md)"
	}
	if serverOpID == "" {
		return "the service's records show this effect happened more than once; nothing is retried: a person corrects it " +
			"with a refund of the duplicate amount on the same payment intent, sent with the header Remediates-Operation-Id " +
			"naming this operation (GET /v1/operations?idempotency_key= finds it)"
	}
	return fmt.Sprintf("the service's records show this effect happened more than once; nothing is retried: a person "+
		"corrects it with a refund of the duplicate amount on the same payment intent, sent with the header "+
		"Remediates-Operation-Id: %s: refund_payment under a new action_id with remediates_operation_id %q (agent do "+
		"--remediates %s). The service accepts corrections of it until they return what the duplicate took; both timelines, GET /v1/operations/%s/timeline, "+
		"show the link", serverOpID, serverOpID, serverOpID, serverOpID)
}

// serverOperationID is the service's operation of op as the answer res names it, else as the journal knows it.
func serverOperationID(op *Operation, res *AttemptResult) string {
	if res != nil && res.ServerOperationID != "" {
		return res.ServerOperationID
	}
	return op.ServerOperationID()
}

// responseExpired reads a 409 idempotency_response_expired: the service kept the key, not its stored answer,
// and names the operation's state and resource. A settled one settles from the answer; one still running or
// unknown is followed as a 202 is.
func (a *Agent) responseExpired(op *Operation, res *AttemptResult, obs []*Observation, wait time.Duration) step {
	switch res.ServerState {
	case "succeeded":
		return step{kind: "settle", state: StateSucceeded,
			why:  "the service reports the operation succeeded; its stored answer has expired (idempotency_response_expired)",
			next: "done: nothing more to do for this action; the body names the operation and the resource it made"}
	case "failed", "cancelled":
		return step{kind: "settle", state: StateFailed,
			why:  "the service reports the operation " + res.ServerState + "; its stored answer has expired (idempotency_response_expired)",
			next: "the service says it did not complete: to try again, call with a new action_id"}
	}
	return a.accepted(op, res, obs, wait)
}

// supersededUnknownAnswer reads a 409 superseded_operation_unknown: the service holds the operation this one
// supersedes as unknown and will not run a replacement unless a person approved this exact request.
func (a *Agent) supersededUnknownAnswer(op *Operation) step {
	a.mu.Lock()
	oldAction := op.SupersedesOperationID
	if old := a.v.ops[op.SupersedesOperationID]; old != nil {
		oldAction = old.ActionID
	}
	a.mu.Unlock()
	next := fmt.Sprintf("the service holds the operation of action %q, which this one supersedes, as unknown and runs no "+
		"replacement while it may have happened. Settle it first (call %q again, or run resume, until the service or a "+
		"person settles it), then start the replacement under a new action_id", oldAction, oldAction)
	if a.takesApproval(op.Tool) {
		next += fmt.Sprintf("; or, to replace it anyway, a person decides: call request_approval with {\"for_action\": %q}, "+
			"have a person approve it, then call %s again with the same action_id and arguments plus approval_id", op.ActionID, op.Tool)
	}
	return step{kind: "settle", state: StateNeedsHuman, why: "the service refuses to supersede an operation of unknown outcome", next: next}
}

func replayedWord(res *AttemptResult) string {
	if res.Replayed {
		return "the service returned its stored answer (replayed)"
	}
	return "the service answered " + strconv.Itoa(res.Status)
}

// accepted handles a 202 (or a 409 naming an unknown operation): poll the operation until it settles.
func (a *Agent) accepted(op *Operation, res *AttemptResult, obs []*Observation, wait time.Duration) step {
	state := res.ServerState
	if n := len(obs); n > 0 {
		state = obs[n-1].ServerState
	}
	switch state {
	case "succeeded":
		if res.ServerState == "unknown" {
			// The stored answer now is the settled one: fetch it with the same key.
			return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "settled_fetch_stored_answer"}
		}
		return step{kind: "settle", state: StateSucceeded, why: "the service finished the accepted operation",
			next: "done: nothing more to do for this action"}
	case "failed", "cancelled", "duplicate_effect_confirmed":
		if res.ServerState == "unknown" {
			return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "settled_fetch_stored_answer"}
		}
		if state == "duplicate_effect_confirmed" {
			return step{kind: "settle", state: StateNeedsHuman, why: "the service found the effect executed more than once",
				next: remediationNext(op.Tool, serverOperationID(op, res))}
		}
		return step{kind: "settle", state: StateFailed, why: "the service reports the operation " + state,
			next: "the service says it did not complete: to try again, call with a new action_id"}
	}
	polls := 0
	for _, o := range obs {
		if o.Kind == ObsPoll {
			polls++
		}
	}
	if res.ServerOperationID == "" || (state == "unknown" && polls >= 3) {
		// A retry with the same key makes the service reconcile an unknown operation at once.
		return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "unknown_same_key_reconciles", wait: wait}
	}
	return step{kind: "poll", decision: "poll_until_settled", wait: wait}
}

// unknownFate is the rule after an attempt that may have reached the service: look up first when the
// operation has a key, then send again with the same key.
func (a *Agent) unknownFate(op *Operation, obs []*Observation, backoff time.Duration) step {
	if op.ParentOperationID != "" && !personSaidGo(op) {
		return parentOwnsRetry(op)
	}
	if op.IdempotencyKey == "" {
		return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "declared_state_send_again", wait: backoff}
	}
	var lookup *Observation
	for _, o := range obs {
		if o.Kind == ObsLookup {
			lookup = o
		}
	}
	switch {
	case lookup == nil:
		return step{kind: "lookup", decision: "look_up_first", wait: backoff / 4}
	case lookup.Found == nil && (op.RetryMode == Financial || op.RetryMode == Destructive):
		// The lookup itself failed: money or an irreversible effect is not sent again blind.
		return step{kind: "lookup", decision: "look_up_again", wait: backoff}
	case lookup.Found == nil:
		return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "same_key_lookup_unavailable", wait: backoff}
	case !*lookup.Found:
		return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "lookup_negative_same_key"}
	default:
		return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "lookup_found_same_key_" + lookup.ServerState}
	}
}

func (a *Agent) backoff(n int) time.Duration {
	ceil := a.cfg.BackoffBase << min(n, 16)
	if ceil > a.cfg.BackoffMax || ceil <= 0 {
		ceil = a.cfg.BackoffMax
	}
	return time.Duration(rand.Int64N(int64(ceil)) + 1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *Agent) baseURL(service string) string { return a.cfg.BaseURLs[service] }

// knownToServer reports whether the service has a record of attempt id: it answered with an operation, or a
// lookup listed it. The services refuse Retry-Of naming an attempt they never received.
func knownToServer(op *Operation, id string) bool {
	for _, at := range op.Attempts {
		if at.AttemptID == id && at.Finished != nil && at.Finished.ServerOperationID != "" {
			return true
		}
	}
	for _, o := range op.Observations {
		if slices.Contains(o.KnownAttempts, id) {
			return true
		}
	}
	return false
}

// send makes one attempt: attempt_started is durable before the request leaves, attempt_finished after.
func (a *Agent) send(ctx context.Context, op *Operation, s step, approvalID string) error {
	if op.Command != nil {
		return a.sendCommand(ctx, op, s)
	}
	at := &Attempt{Type: RecAttemptStarted, OperationID: op.OperationID, AttemptID: ids.New("att_"), Number: len(op.Attempts) + 1,
		Decision: s.decision, BudgetLeft: op.budgetLeft() - 1, ApprovalID: approvalID, GrantID: a.grantFor(op, approvalID), RunID: a.runID,
		At: a.now(), Process: a.process(op)}
	if prev := lastAttempt(op); prev != nil {
		retryLineage(op, at, prev, s.reason)
	}
	endSpan := traceAttempt(ctx, op, at)
	defer endSpan()
	req, err := a.newRequest(op, at, approvalID)
	if err != nil {
		return err
	}
	if err := a.record(at); err != nil {
		return err
	}
	a.cfg.Hook("before_send")
	start := time.Now()
	return a.finish(op, at, a.exchange(ctx, req), start)
}

// retryLineage describes at as a retry of prev: the reason the rule gave (or an operator's request), and the
// attempt it names in Retry-Of, the newest the service knows of, none after the service refused prev's lineage.
func retryLineage(op *Operation, at, prev *Attempt, reason string) {
	at.RetryOf, at.RetryReason = prev.AttemptID, reason
	if at.RetryReason == "" {
		at.RetryReason = ReasonResponseLostAfterDispatch
	}
	if retryRequestedSince(op, prev) {
		at.RetryReason = ReasonOperatorRequested // the decision keeps what the rule saw
	}
	at.RetryReasonSent = wireReasons[at.RetryReason]
	if op.IdempotencyKey == "" {
		at.RetryOfSent = prev.AttemptID
	} else {
		for _, p := range slices.Backward(op.Attempts) {
			if knownToServer(op, p.AttemptID) {
				at.RetryOfSent = p.AttemptID
				break
			}
		}
	}
	if prev.Finished != nil && refusedLineage(prev.Finished) {
		at.RetryOfSent = "" // the service refused the last one's lineage: this one claims none
	}
	if _, lost := remakeStep(op, prev); lost {
		at.RetryOfSent = "" // the service lost the attempts it had seen (lost.go)
	}
}

// traceAttempt starts the attempt's span, when tracing is on, and records its traceparent in at; the returned
// function ends the span.
func traceAttempt(ctx context.Context, op *Operation, at *Attempt) (end func()) {
	if !tracing.Enabled() {
		return func() {}
	}
	// One trace per action: the first attempt starts it, every later one is a child of the first.
	sctx := ctx
	for _, p := range op.Attempts {
		if p.TraceParent != "" {
			sctx = tracing.Parent(ctx, p.TraceParent)
			break
		}
	}
	sctx, span := tracing.Start(sctx, "agent.attempt "+op.Tool,
		attribute.String("retrysafe.action_id", op.ActionID), attribute.Int("retrysafe.attempt", at.Number))
	at.TraceParent = tracing.TraceParent(sctx)
	return func() { span.End() }
}

// exchange sends req within the attempt timeout and says how far it got: not sent, sent with no answer, or the
// answer.
func (a *Agent) exchange(ctx context.Context, req *http.Request) *AttemptResult {
	// The after_send hook runs once the request's bytes are on the socket (net/http reports WroteRequest while
	// they may still sit in its buffer): from the connection's Write after WroteRequest, or, with a client whose
	// connections this package does not see, once Do returns. A test that stops the process there stops it
	// before the answer is read, whichever goroutine gets there first (sync.Once blocks the other).
	st := &dispatch{hook: func() { a.cfg.Hook("after_send") }}
	trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			st.wrote.Store(true)
		}
	}}
	actx, cancel := context.WithTimeout(context.WithValue(ctx, dispatchKey{}, st), a.cfg.AttemptTimeout)
	defer cancel()
	resp, err := a.cfg.HTTPClient.Do(req.WithContext(httptrace.WithClientTrace(actx, trace)))
	wrote := st.wrote.Load()
	if wrote {
		st.once.Do(st.hook)
	}
	if err != nil {
		r := &AttemptResult{DispatchState: NotSent, Error: transportError(err)}
		if wrote {
			r.DispatchState = SentNoResponse
		}
		return r
	}
	return a.readAnswer(resp)
}

// readAnswer reads the service's answer: its status, the idempotency headers and, from a JSON body, the code,
// the operation, its key's expiry and the state of work the service has not settled.
func (a *Agent) readAnswer(resp *http.Response) *AttemptResult {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	resp.Body.Close()
	if err != nil {
		// The status came, the body did not: what the service did is not known from here.
		return &AttemptResult{DispatchState: SentNoResponse, Status: resp.StatusCode, Error: "body_read_failed"}
	}
	a.cfg.Hook("after_answer")
	r := &AttemptResult{DispatchState: ResponseReceived, Status: resp.StatusCode, Replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		ServerOperationID: resp.Header.Get("Operation-Id"), RetryAfterSeconds: retryAfter(resp.Header.Get("Retry-After"))}
	if !json.Valid(raw) {
		return r
	}
	r.Body = raw
	var b struct {
		Code         string `json:"code"`
		OperationID  string `json:"operation_id"`
		State        string `json:"state"`
		KeyExpiresAt string `json:"key_expires_at"`
	}
	_ = json.Unmarshal(raw, &b)
	r.Code, r.KeyExpiresAt = b.Code, b.KeyExpiresAt
	if r.ServerOperationID == "" {
		r.ServerOperationID = b.OperationID
	}
	if resp.StatusCode == http.StatusAccepted || b.Code == "outcome_unknown" || b.Code == "idempotency_response_expired" {
		r.ServerState = b.State
	}
	return r
}

// newRequest builds the attempt's request, or refuses it before the attempt is journaled: a request that could
// not leave (a body over the limit, a header value HTTP forbids) would fail every attempt as not_sent and spend
// the budget on nothing.
func (a *Agent) newRequest(op *Operation, at *Attempt, approvalID string) (*http.Request, error) {
	body, err := a.requestBody(op)
	if err != nil {
		return nil, err
	}
	if len(body) > a.cfg.MaxBodyBytes {
		return nil, fmt.Errorf("%w: the request body is %d bytes; the agent sends at most %d (Config.MaxBodyBytes); nothing was sent",
			ErrBadArguments, len(body), a.cfg.MaxBodyBytes)
	}
	req, err := http.NewRequest(op.Method, a.baseURL(op.Service)+op.Path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("agent: %s %s: the request cannot be built (check the service URL); nothing was sent", op.Method, op.RouteTemplate)
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("Authorization", "Bearer "+a.cfg.APIKey)
	h.Set("Attempt-Id", at.AttemptID)
	h.Set("Agent-Run-Id", a.runID)
	if op.IdempotencyKey != "" {
		h.Set("Idempotency-Key", op.IdempotencyKey)
		h.Set("Prefer", "wait=10")
	}
	if at.RetryOfSent != "" {
		h.Set("Retry-Of", at.RetryOfSent)
		h.Set("Retry-Reason", at.sentReason())
	}
	if op.SupersedesServerOpID != "" {
		h.Set("Supersedes-Operation-Id", op.SupersedesServerOpID)
	}
	if op.RemediatesServerOpID != "" {
		h.Set("Remediates-Operation-Id", op.RemediatesServerOpID)
	}
	if approvalID != "" {
		h.Set("Approval-Id", approvalID)
	}
	if at.GrantID != "" {
		h.Set("Grant-Id", at.GrantID)
	}
	if at.TraceParent != "" {
		h.Set("Traceparent", at.TraceParent)
	}
	for name, values := range h {
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, fmt.Errorf("%w: the %s header would carry a character HTTP forbids; nothing was sent", ErrBadArguments, name)
			}
		}
	}
	return req, nil
}

func (a *Agent) finish(op *Operation, at *Attempt, r *AttemptResult, start time.Time) error {
	r.Type, r.OperationID, r.AttemptID = RecAttemptFinished, op.OperationID, at.AttemptID
	r.DurationMS, r.At = time.Since(start).Milliseconds(), a.now()
	return a.record(r)
}

// requestBody is what the operation sends; request_approval's is built from the action it is for.
func (a *Agent) requestBody(op *Operation) ([]byte, error) {
	// The journal has all the body needs (method, route, arguments): what the tools file says now does not change
	// what an operation made before sends.
	req, err := Tool{Name: op.Tool, Method: op.Method, Route: op.RouteTemplate}.prepare(op.Args)
	if err != nil {
		return nil, err
	}
	if !a.isApprovalRequest(op) {
		return req.body, nil
	}
	var f struct {
		ForAction string `json:"for_action"`
	}
	_ = json.Unmarshal(op.Args, &f)
	a.mu.Lock()
	target := a.v.byAction[f.ForAction]
	a.mu.Unlock()
	if target == nil {
		return nil, fmt.Errorf("%w: for_action %q", ErrUnknownAction, f.ForAction)
	}
	treq, err := Tool{Name: target.Tool, Method: target.Method, Route: target.RouteTemplate}.prepare(target.Args)
	if err != nil {
		return nil, err
	}
	body := map[string]any{"method": target.Method, "path": target.Path,
		"idempotency_key": target.IdempotencyKey, "body": json.RawMessage(treq.body)}
	if target.SupersedesServerOpID != "" {
		// The write goes with Supersedes-Operation-Id: the approver is shown that operation, and the service
		// lets the write replace it while its outcome is unknown only with an approval that names it.
		body["supersedes_operation_id"] = target.SupersedesServerOpID
	}
	return json.Marshal(body)
}

// transportError names a transport failure from a fixed list: error text never goes to the journal.
func transportError(err error) string {
	var ue *url.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.As(err, &ue) && strings.Contains(ue.Err.Error(), "connection refused"):
		return "connection_refused"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "connection_closed"
	}
	return "transport_error"
}

func retryAfter(v string) int {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return min(n, 300)
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(int(time.Until(t).Seconds()+0.999), 0), 300)
	}
	return 0
}

// operationView is the part of a service's operation the agent reads.
type operationView struct {
	ID           string `json:"id"`
	State        string `json:"state"`
	KeyExpiresAt string `json:"key_expires_at"`
	Events       []struct {
		Detail map[string]any `json:"detail"`
	} `json:"events"`
}

func (o operationView) attempts() []string {
	var out []string
	for _, e := range o.Events {
		if id, ok := e.Detail["attempt_id"].(string); ok && id != "" && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// lookup asks the service for the operation under the key: an observation, positive or negative.
func (a *Agent) lookup(ctx context.Context, op *Operation) error {
	endpoint := a.operationsRoute(op) + "?idempotency_key=" + url.QueryEscape(op.IdempotencyKey)
	ob := Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsLookup, Endpoint: "GET " + endpoint, RunID: a.runID}
	if a.operationsRoute(op) == "" {
		ob.Endpoint, ob.At = "", a.now()
		ob.Detail = "lookup failed: the tools file names no operations route for service " + op.Service
		return a.record(ob)
	}
	var res struct {
		Items []operationView `json:"items"`
	}
	start := time.Now()
	status, err := a.get(ctx, a.baseURL(op.Service)+endpoint, &res)
	ob.Status, ob.DurationMS, ob.At = status, time.Since(start).Milliseconds(), a.now()
	switch {
	case err != nil:
		ob.Detail = "lookup failed: " + err.Error()
	case len(res.Items) == 0:
		found := false
		ob.Found = &found
		ob.Detail = "the service had no operation under this key when asked: no earlier attempt had reached it (yet)"
	default:
		found := true
		it := res.Items[0]
		ob.Found, ob.ServerOperationID, ob.ServerState, ob.KnownAttempts = &found, it.ID, it.State, it.attempts()
		ob.KeyExpiresAt = it.KeyExpiresAt
	}
	return a.record(ob)
}

// poll asks for the operation an answer named.
func (a *Agent) poll(ctx context.Context, op *Operation) error {
	id := op.ServerOperationID()
	endpoint := a.operationsRoute(op) + "/" + url.PathEscape(id)
	ob := Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsPoll, Endpoint: "GET " + endpoint, RunID: a.runID}
	if a.operationsRoute(op) == "" {
		ob.Endpoint, ob.At = "", a.now()
		ob.Detail = "poll failed: the tools file names no operations route for service " + op.Service
		return a.record(ob)
	}
	var it operationView
	start := time.Now()
	status, err := a.get(ctx, a.baseURL(op.Service)+endpoint, &it)
	ob.Status, ob.DurationMS, ob.At = status, time.Since(start).Milliseconds(), a.now()
	switch {
	case status == http.StatusNotFound:
		found := false
		ob.Found = &found
		ob.Detail = "the service has no operation " + id
	case err != nil:
		ob.Detail = "poll failed: " + err.Error()
	default:
		found := true
		ob.Found, ob.ServerOperationID, ob.ServerState, ob.KeyExpiresAt = &found, it.ID, it.State, it.KeyExpiresAt
	}
	return a.record(ob)
}

// get reads a JSON answer; a non-200 answer or a transport failure is an error named from a fixed list.
func (a *Agent) get(ctx context.Context, u string, out any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, errors.New("bad_url")
	}
	req.Header.Set("Authorization", "Bearer "+a.cfg.APIKey)
	req.Header.Set("Agent-Run-Id", a.runID)
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, errors.New(transportError(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return resp.StatusCode, errors.New("body_read_failed")
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("status %d", resp.StatusCode)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return resp.StatusCode, errors.New("not_json")
	}
	return resp.StatusCode, nil
}

// settle records how the operation ended, with the evidence.
func (a *Agent) settle(op *Operation, s step) error {
	st := Settlement{Type: RecOperationSettled, OperationID: op.OperationID, State: s.state, Reason: s.why, NextStep: s.next,
		ServerOperationID: op.ServerOperationID(), RunID: a.runID, At: a.now(), Evidence: evidence(op), Code: s.code}
	if last := lastAttempt(op); last != nil && last.Finished != nil && !s.fromLookup {
		st.HTTPStatus, st.Code, st.Body = last.Finished.Status, last.Finished.Code, last.Finished.Body
		st.ApprovalID = last.ApprovalID
	}
	if s.body != nil {
		st.HTTPStatus, st.Body = s.status, s.body
	}
	if a.isApprovalRequest(op) && s.state == StateSucceeded {
		var ap struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(st.Body, &ap)
		var f struct {
			ForAction string `json:"for_action"`
		}
		_ = json.Unmarshal(op.Args, &f)
		st.ApprovalID = ap.ID
		st.NextStep = fmt.Sprintf("approval %s is pending: a person approves it (POST /v1/approvals/%s/approve with an approver's key); "+
			"then call action %q again with the same arguments plus \"approval_id\": %q", ap.ID, ap.ID, f.ForAction, ap.ID)
	}
	return a.record(st)
}

// evidence lists the attempts and observations in words, for the settlement record and for people.
func evidence(op *Operation) []string {
	var out []string
	for _, at := range op.Attempts {
		line := fmt.Sprintf("attempt %d %s (%s)", at.Number, at.AttemptID, at.Decision)
		if r := at.Finished; r != nil {
			line += ": " + r.DispatchState
			if r.Status != 0 {
				line += fmt.Sprintf(" %d", r.Status)
			}
			if r.Code != "" {
				line += " " + r.Code
			}
			if r.Error != "" {
				line += " " + r.Error
			}
		} else {
			line += ": no recorded end (the agent stopped during it)"
		}
		out = append(out, line)
	}
	for _, o := range op.Observations {
		line := o.Kind
		if o.Endpoint != "" {
			line += " " + o.Endpoint
		}
		switch {
		case o.Found != nil && *o.Found:
			line += ": found " + o.ServerOperationID + " " + o.ServerState
		case o.Found != nil:
			line += ": not found"
		case o.Detail != "":
			line += ": " + o.Detail
		}
		out = append(out, line)
	}
	return out
}
