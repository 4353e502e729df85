package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/services/provider"
)

// EventProviderLookup is the operation event that records what the provider answered when a reconciler asked
// about the operation's downstream key: the evidence a settlement rests on.
const EventProviderLookup = "provider_lookup"

// recordFunc is the Record step of one kind (settle.go), T the provider's answer to the kind's call; the
// handler and the reconciler share it.
type recordFunc[T any] func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, outcome T, callErr error) (idem.Result, error)

// Reconcilers returns the reconciler of every payments operation kind, for the recovery worker.
func (s *Server) Reconcilers() map[string]opstatus.Reconciler {
	return map[string]opstatus.Reconciler{
		KindCreateIntent: reconciler[provider.Authorization](s, s.recordCreate, nil),
		KindCapture:      reconciler[provider.Capture](s, s.recordCapture, nil),
		KindCancel:       reconciler[provider.Authorization](s, s.recordCancel, nil),
		KindRefund:       reconciler[provider.Refund](s, s.recordRefund, s.recordDuplicatedRefund),
	}
}

// errLeaseRunning leaves an operation unknown for a later pass.
var errLeaseRunning = errors.New("payments: the operation's lease has not ended; its provider call may still arrive")

// duplicatedFunc books, with the settlement, what a call the provider executed more than once (effects, one id
// per execution) did; the resource it names goes on the operation.
type duplicatedFunc func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, effects []string) (*opstatus.Resource, error)

// settleWrite is the write a reconciler settles an operation with (idem's Settle).
type settleWrite = func(ctx context.Context, tx *gorm.DB) (idem.Result, error)

// reconciler settles an unknown operation from the provider's record of its downstream key. T is the type of
// the provider's answer to the kind's call. It never calls the provider's write endpoints: a capture is sent by
// the handler once, or never. duplicated, when set, books a call executed more than once.
func reconciler[T any](s *Server, record recordFunc[T], duplicated duplicatedFunc) opstatus.Reconciler {
	return opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
		key, res, err := s.lookup(ctx, op)
		evidence := map[string]any{"downstream_key": key, "endpoint": "GET /v1/idempotency/{key}"}
		if err != nil {
			return s.failedLookup(ctx, op, key, evidence, err)
		}
		outcome, callErr, err := readLookup[T](ctx, s, op, res, evidence)
		if err != nil {
			return err
		}
		if err := opstatus.Append(ctx, database.SQL(s.db), op.AccountID, op.ID, EventProviderLookup, reconcilerActor, evidence); err != nil {
			return err
		}
		write := recordWrite(record, op, outcome, callErr)
		if len(res.Effects) > 1 {
			write = duplicateWrite(op, res.Effects, duplicated)
		}
		err = s.idem.Settle(ctx, op, reconcilerActor, write)
		if errors.Is(err, idem.ErrAlreadySettled) {
			return nil
		}
		return err
	})
}

// failedLookup records a lookup that could not reach the provider, or found the call still running there, and
// returns lookupErr so the operation is asked about again on a later pass. The failed lookup is evidence too: it
// says when someone asked and could not learn.
func (s *Server) failedLookup(ctx context.Context, op opstatus.Operation, key string, evidence map[string]any, lookupErr error) error {
	evidence["result"], evidence["reason"] = "failed", lookupFailure(lookupErr)
	if err := opstatus.Append(ctx, database.SQL(s.db), op.AccountID, op.ID, EventProviderLookup, reconcilerActor, evidence); err != nil {
		return err
	}
	return fmt.Errorf("payments: reconcile %s: lookup %s: %w", op.ID, key, lookupErr)
}

// readLookup reads the provider's answer res into the kind's outcome and its call error, and adds to evidence
// what the answer shows. When nothing was found, the call error is errNotExecuted once negativeLookup proves the
// call can no longer arrive; its error otherwise.
func readLookup[T any](ctx context.Context, s *Server, op opstatus.Operation, res provider.LookupResult, evidence map[string]any) (outcome T, callErr error, err error) {
	evidence["found"], evidence["result"] = res.Found, "not_found"
	if !res.Found {
		if err := s.negativeLookup(ctx, op, evidence); err != nil {
			return outcome, nil, err
		}
		return outcome, errNotExecuted, nil
	}
	callErr = res.Answer(&outcome)
	evidence["result"], evidence["status"], evidence["body"] = "found", res.Status, json.RawMessage(res.Body)
	evidence["effects"] = res.Effects
	return outcome, callErr, nil
}

// recordWrite settles op with the kind's Record step, on the remote record found unless the step says why.
func recordWrite[T any](record recordFunc[T], op opstatus.Operation, outcome T, callErr error) settleWrite {
	return func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
		res, err := record(ctx, tx, op, outcome, callErr)
		if res.Reason == "" {
			res.Reason = opstore.ReasonRemoteRecordFound
		}
		return res, err
	}
}

// duplicateWrite settles op whose call the provider executed more than once (effects): not a success, not a
// failure, and never retried. A refund is booked as executed (each execution paid out); a capture's intent keeps
// its reservation for the correction that records it (remediate.go).
func duplicateWrite(op opstatus.Operation, effects []string, duplicated duplicatedFunc) settleWrite {
	return func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
		p := problem.New("duplicate_effect_confirmed",
			"the payment provider executed this request %d times (%s); nothing will be retried: see docs/payments.md for its correction",
			len(effects), strings.Join(effects, ", ")).With("remote_ids", effects)
		result := idem.ProblemResult(p, opstatus.StateDuplicateEffect)
		if duplicated != nil {
			resource, err := duplicated(ctx, tx, op, effects)
			if err != nil {
				return idem.Result{}, recorded(err)
			}
			result.Resource = resource
		}
		return result, nil
	}
}

// lookup asks the provider what it answered under op's downstream key, and returns the key it asked about.
func (s *Server) lookup(ctx context.Context, op opstatus.Operation) (string, provider.LookupResult, error) {
	key, err := s.downstreamKey(ctx, op)
	if err != nil {
		return "", provider.LookupResult{}, err
	}
	res, err := s.cfg.Provider.Lookup(ctx, key)
	if err == nil && !res.Found {
		// Dispatched before provider keys were derived from the request: under the operation's id.
		old := operationDownstreamKey(op.ID)
		if prev, perr := s.cfg.Provider.Lookup(ctx, old); perr != nil || prev.Found {
			return old, prev, perr
		}
	}
	return key, res, err
}

// negativeLookup decides whether nothing under the downstream key proves that the call never executed, and
// says why in evidence["conclusive_because"]: our own call can no longer arrive (opstatus.CallMayLand: its
// dispatch record shows it over, or the lease that bounds it, callContext, has ended). While it may still
// arrive the negative lookup proves nothing: it is recorded, and errLeaseRunning leaves the operation unknown
// for a later pass.
func (s *Server) negativeLookup(ctx context.Context, op opstatus.Operation, evidence map[string]any) error {
	until, reason, err := opstatus.CallMayLand(ctx, database.SQL(s.db), op, s.idem.Clock.Now())
	if err != nil {
		return err
	}
	if until.IsZero() {
		evidence["conclusive_because"] = reason
		return nil
	}
	evidence["lease_running"] = true
	if err := opstatus.Append(ctx, database.SQL(s.db), op.AccountID, op.ID, EventProviderLookup, reconcilerActor, evidence); err != nil {
		return err
	}
	return errLeaseRunning
}

// lookupFailure names, from a fixed list, why a lookup learned nothing; the error itself goes to the log.
func lookupFailure(err error) string {
	var pe *provider.Error
	switch {
	case errors.Is(err, provider.ErrNotSent):
		return "provider_unreachable"
	case errors.As(err, &pe) && pe.Code == provider.CodeRequestInProgress:
		return "call_in_progress"
	case errors.Is(err, provider.ErrOutcomeUnknown):
		return "no_answer"
	case errors.As(err, &pe):
		return "refused"
	}
	return "lookup_failed"
}
