package idem

import (
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Observer learns what the Handler decided, for metrics (package metrics implements it).
type Observer interface {
	// IdempotencyOutcome is called once per request the handler answers, with the request's kind.
	IdempotencyOutcome(kind string, outcome Outcome)
	// BackgroundRunning is called when Handler.RunBackground starts (true) and ends (false), and once with false
	// when the handler answers a write while it is not running.
	BackgroundRunning(running bool)
	// OperationFinished and Reconciled are called after the commit that settled an operation.
	opstatus.Observer
}

// Outcome is what the handler decided about one request.
type Outcome string

const (
	outcomeCreated          Outcome = "created"           // claimed and ran; its result is stored
	outcomeReplayed         Outcome = "replayed"          // the stored answer, sent again
	outcomeExpired          Outcome = "response_expired"  // the key lives, its stored answer was pruned: 409
	outcomeConflict         Outcome = "conflict"          // the key was first used for another request: 422
	outcomeInProgress       Outcome = "in_progress"       // the first request is still running: 409
	outcomeUnknown          Outcome = "unknown"           // the outcome is not known, or ran but was not recorded
	outcomeRefused          Outcome = "refused"           // refused before any effect, the key left free
	outcomeStoreUnavailable Outcome = "store_unavailable" // the database could not be reached: 503
	outcomeUnkeyed          Outcome = "unkeyed"           // ran without an Idempotency-Key (Handler.KeyOptional)
)

func (h *Handler) observe(kind string, o Outcome) {
	if h.Observer != nil {
		h.Observer.IdempotencyOutcome(kind, o)
	}
}

// OperationObserver is h.Observer as an opstatus.Observer, nil when there is none (a nil Observer inside a
// non-nil interface would be called), for a service that settles operations by itself.
func (h *Handler) OperationObserver() opstatus.Observer {
	if h == nil || h.Observer == nil {
		return nil
	}
	return h.Observer
}

// fail answers a request that err ended before or instead of its effect, counted as a store failure or a
// refusal.
func (h *Handler) fail(kind string, err error) Answer {
	if problem.IsStoreUnavailable(err) {
		h.observe(kind, outcomeStoreUnavailable)
	} else {
		h.observe(kind, outcomeRefused)
	}
	return Answer{Err: err}
}

// observeReconciled tells o, when o is not nil, what asking the reconciler of kind achieved.
func observeReconciled(o opstatus.Observer, kind string, result opstatus.ReconcileResult) {
	if o != nil {
		o.Reconciled(kind, result)
	}
}
