package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
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
		KindCreateIntent: reconciler[provider.Authorization](s, s.recordCreate),
		KindCapture:      reconciler[provider.Capture](s, s.recordCapture),
		KindCancel:       reconciler[provider.Authorization](s, s.recordCancel),
		KindRefund:       reconciler[provider.Refund](s, s.recordRefund),
	}
}

// errLeaseRunning leaves an operation unknown for a later pass.
var errLeaseRunning = errors.New("payments: the operation's lease has not ended; its provider call may still arrive")

// reconciler settles an unknown operation from the provider's record of its downstream key. T is the type of
// the provider's answer to the kind's call. It never calls the provider's write endpoints: a capture is sent by
// the handler once, or never.
func reconciler[T any](s *Server, record recordFunc[T]) opstatus.Reconciler {
	return opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
		key := DownstreamKey(op)
		res, err := s.cfg.Provider.Lookup(ctx, key)
		if err == nil && !res.Found {
			// Dispatched before provider keys were derived from the request: under the operation's id.
			old := operationDownstreamKey(op.ID)
			if prev, perr := s.cfg.Provider.Lookup(ctx, old); perr != nil || prev.Found {
				key, res, err = old, prev, perr
			}
		}
		evidence := map[string]any{"downstream_key": key, "endpoint": "GET /v1/idempotency/{key}"}
		if err != nil {
			// Unreachable provider, or the call is still running there: ask again on a later pass. The failed
			// lookup is evidence too: it says when someone asked and could not learn.
			evidence["result"], evidence["reason"] = "failed", lookupFailure(err)
			if aerr := opstatus.Append(ctx, s.db, op.AccountID, op.ID, EventProviderLookup, reconcilerActor, evidence); aerr != nil {
				return aerr
			}
			return fmt.Errorf("payments: reconcile %s: lookup %s: %w", op.ID, key, err)
		}
		var (
			outcome T
			callErr error
		)
		if res.Found {
			callErr = res.Answer(&outcome)
		} else {
			// Nothing under the key proves the call never executed only once our own call can no longer
			// arrive: it is bounded by the lease (callContext).
			if op.LeaseExpiresAt != nil && time.Now().Before(*op.LeaseExpiresAt) {
				// A negative answer while our call may still arrive proves nothing, but it is recorded.
				evidence["found"], evidence["result"], evidence["lease_running"] = false, "not_found", true
				if err := opstatus.Append(ctx, s.db, op.AccountID, op.ID, EventProviderLookup, reconcilerActor, evidence); err != nil {
					return err
				}
				return errLeaseRunning
			}
			callErr = errNotExecuted
		}
		evidence["found"], evidence["result"] = res.Found, "not_found"
		if res.Found {
			evidence["result"] = "found"
			evidence["status"] = res.Status
			evidence["body"] = json.RawMessage(res.Body)
		}
		if res.Found {
			evidence["effects"] = res.Effects
		}
		if err := opstatus.Append(ctx, s.db, op.AccountID, op.ID, EventProviderLookup, reconcilerActor, evidence); err != nil {
			return err
		}
		write := func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
			res, err := record(ctx, tx, op, outcome, callErr)
			if res.Reason == "" {
				res.Reason = opstatus.ReasonRemoteRecordFound
			}
			return res, err
		}
		if len(res.Effects) > 1 {
			// The provider executed the call more than once: not a success, not a failure, and never retried.
			// The intent keeps its reservation for the person who corrects it.
			write = func(context.Context, *gorm.DB) (idem.Result, error) {
				p := problem.New(problem.CodeDuplicateEffect,
					"the payment provider executed this request %d times (%s); nothing will be retried: correct it with a new operation",
					len(res.Effects), strings.Join(res.Effects, ", ")).With("remote_ids", res.Effects)
				return idem.ProblemResult(p, opstatus.StateDuplicateEffect), nil
			}
		}
		err = s.idem.Settle(ctx, op, reconcilerActor, write)
		if errors.Is(err, idem.ErrAlreadySettled) {
			return nil
		}
		return err
	})
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
