package idem

import (
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Observer learns what the Handler decided, for metrics (package metrics of retrysafe implements it; any other
// will do). Handler.Observer may be nil: nobody is told.
type Observer interface {
	// IdempotencyOutcome is called once per request the handler answers, with the request's kind.
	IdempotencyOutcome(kind string, outcome Outcome)
	// OperationFinished and Reconciled (opstatus.Observer) are called after the commit that settled an
	// operation (Do, DoExternal, Settle) and after reconcileNow asked a reconciler.
	opstatus.Observer
}

// Outcome is what the handler decided about one request.
type Outcome string

const (
	// OutcomeCreated: the request claimed its key and ran; its result (success or a definite failure) is stored.
	OutcomeCreated Outcome = "created"
	// OutcomeReplayed: the stored answer of an earlier request with the key was sent again.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeConflict: the key was first used for another request (422 idempotency_key_reused).
	OutcomeConflict Outcome = "conflict"
	// OutcomeInProgress: the first request with the key is still running (409 request_in_progress).
	OutcomeInProgress Outcome = "in_progress"
	// OutcomeUnknown: the operation's outcome is not known (202 naming the operation), or the effect ran but
	// its result could not be recorded.
	OutcomeUnknown Outcome = "unknown"
	// OutcomeRefused: refused before any effect, the key left free: a missing or invalid key, a guard (approval)
	// or a business rule that rolled the claim back.
	OutcomeRefused Outcome = "refused"
	// OutcomeStoreUnavailable: the database could not be reached (503 store_unavailable).
	OutcomeStoreUnavailable Outcome = "store_unavailable"
)

func (h *Handler) observe(kind string, o Outcome) {
	if h.Observer != nil {
		h.Observer.IdempotencyOutcome(kind, o)
	}
}

// OperationObserver is h.Observer as an opstatus.Observer, nil when there is none (a nil Observer inside a
// non-nil interface would be called), for the code of a service that settles operations by itself.
func (h *Handler) OperationObserver() opstatus.Observer {
	if h == nil || h.Observer == nil {
		return nil
	}
	return h.Observer
}

// failureOutcome classifies an error that ended a request before or instead of its effect.
func failureOutcome(err error, otherwise Outcome) Outcome {
	if problem.IsStoreUnavailable(err) {
		return OutcomeStoreUnavailable
	}
	return otherwise
}
