package payments

// Settlement: how the outcome of each provider call is recorded. The handlers (through idem.RunExternal's Record
// step) and the reconcilers (through idem.Handler.Settle) record with the same functions, so an outcome learned
// from a lost answer's lookup is written exactly as one learned from the answer itself.

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/services/provider"
)

// errNotExecuted is the outcome of a call the provider never executed: a reconciler found nothing under its
// downstream key once the call could no longer arrive (its answer came back, or its lease ran out).
var errNotExecuted = errors.New("payments: the provider never executed the call")

// recordCreate records the authorization's outcome: the handler and the reconciler both go through it.
func (s *Server) recordCreate(ctx context.Context, tx *gorm.DB, op opstatus.Operation, a provider.Authorization, callErr error) (idem.Result, error) {
	if res, adopted, err := s.recordAdopted(ctx, tx, op); adopted || err != nil {
		return res, err
	}
	if callErr != nil {
		p, err := refusal(callErr, "authorization")
		if err != nil {
			return idem.Result{}, err
		}
		in, err := s.cfg.Store.AuthorizationFailed(ctx, tx, op.AccountID, op.ID)
		if err != nil {
			return idem.Result{}, recorded(err)
		}
		return withResource(idem.ProblemResult(p.With("intent_id", in.ID), opstatus.StateFailed), "payment_intent", in.ID), nil
	}
	in, err := s.cfg.Store.Authorized(ctx, tx, op.AccountID, op.ID, a.ID)
	if err != nil {
		return idem.Result{}, recorded(err)
	}
	return withResource(idem.Result{Status: http.StatusCreated, Body: in,
		Header: http.Header{"Location": {"/v1/payment_intents/" + in.ID}}}, "payment_intent", in.ID), nil
}

// recordCapture records a capture's outcome: a capture captures the intent, anything else releases it.
func (s *Server) recordCapture(ctx context.Context, tx *gorm.DB, op opstatus.Operation, cp provider.Capture, callErr error) (idem.Result, error) {
	if res, adopted, err := s.recordAdopted(ctx, tx, op); adopted || err != nil {
		return res, err
	}
	if callErr != nil {
		return s.release(ctx, tx, op, callErr, "capture")
	}
	in, err := s.cfg.Store.Captured(ctx, tx, op.AccountID, op.ID, cp.AmountMinor)
	if err != nil {
		return idem.Result{}, recorded(err)
	}
	return withResource(idem.Result{Status: http.StatusOK, Body: in}, "payment_intent", in.ID), nil
}

// release records a capture or void that did not happen and returns the intent to requires_capture.
func (s *Server) release(ctx context.Context, tx *gorm.DB, op opstatus.Operation, callErr error, action string) (idem.Result, error) {
	p, err := refusal(callErr, action)
	if err != nil {
		return idem.Result{}, err
	}
	in, err := s.cfg.Store.Release(ctx, tx, op.AccountID, op.ID)
	if err != nil {
		return idem.Result{}, recorded(err)
	}
	return withResource(idem.ProblemResult(p.With("intent_id", in.ID), opstatus.StateFailed), "payment_intent", in.ID), nil
}

// recordCancel records a void's outcome.
func (s *Server) recordCancel(ctx context.Context, tx *gorm.DB, op opstatus.Operation, _ provider.Authorization, callErr error) (idem.Result, error) {
	if res, adopted, err := s.recordAdopted(ctx, tx, op); adopted || err != nil {
		return res, err
	}
	if callErr != nil {
		return s.release(ctx, tx, op, callErr, "cancel")
	}
	in, err := s.cfg.Store.Canceled(ctx, tx, op.AccountID, op.ID)
	if err != nil {
		return idem.Result{}, recorded(err)
	}
	return withResource(idem.Result{Status: http.StatusOK, Body: in}, "payment_intent", in.ID), nil
}

// recordRefund records a refund's outcome: a refund adds to the intent's refunded total, anything else
// releases the reserved amount.
func (s *Server) recordRefund(ctx context.Context, tx *gorm.DB, op opstatus.Operation, prf provider.Refund, callErr error) (idem.Result, error) {
	if res, adopted, err := s.recordAdopted(ctx, tx, op); adopted || err != nil {
		return res, err
	}
	if callErr != nil {
		p, err := refusal(callErr, "refund")
		if err != nil {
			return idem.Result{}, err
		}
		rf, err := s.cfg.Store.RefundFailed(ctx, tx, op.AccountID, op.ID)
		if err != nil {
			return idem.Result{}, recorded(err)
		}
		return withResource(idem.ProblemResult(p.With("refund_id", rf.ID), opstatus.StateFailed), "refund", rf.ID), nil
	}
	rf, err := s.cfg.Store.RefundSucceeded(ctx, tx, op.AccountID, op.ID, prf.ID)
	if err != nil {
		return idem.Result{}, recorded(err)
	}
	return withResource(idem.Result{Status: http.StatusCreated, Body: rf,
		Header: http.Header{"Location": {"/v1/refunds/" + rf.ID}}}, "refund", rf.ID), nil
}

// recordDuplicatedRefund books a refund the provider executed len(effects) times: every execution paid out, so
// every one is in the intent's refunded total, and what is left to refund is what the provider has left.
func (s *Server) recordDuplicatedRefund(ctx context.Context, tx *gorm.DB, op opstatus.Operation, effects []string) (*opstatus.Resource, error) {
	rf, err := s.cfg.Store.RefundDuplicated(ctx, tx, op.AccountID, op.ID, effects[0], len(effects))
	if err != nil {
		return nil, err
	}
	return &opstatus.Resource{Type: "refund", ID: rf.ID}, nil
}

// refusal turns a definite outcome other than success into the problem stored for the operation. An error it
// does not know is returned as is: the outcome stays unrecorded and the recovery worker settles it later.
func refusal(callErr error, action string) (*problem.Error, error) {
	if errors.Is(callErr, errNotExecuted) || errors.Is(callErr, idem.ErrNotSent) || errors.Is(callErr, provider.ErrNotSent) {
		return problem.New("provider_unavailable",
			"the %s never reached the payment provider and nothing happened; send it again with a new Idempotency-Key", action), nil
	}
	var pe *provider.Error
	if !errors.As(callErr, &pe) || errors.Is(callErr, provider.ErrOutcomeUnknown) {
		return nil, callErr
	}
	var p *problem.Error
	switch pe.Code {
	case provider.CodeAmountTooLarge:
		p = problem.New("amount_too_large", "the payment provider refused the %s: %s", action, pe.Detail)
	case provider.CodeAlreadyCaptured, provider.CodeInvalidState:
		p = problem.New("invalid_state", "the payment provider refused the %s: %s", action, pe.Detail)
	default:
		p = problem.New("provider_declined", "the payment provider declined the %s: %s", action, pe.Detail)
	}
	return p.With("provider_code", pe.Code), nil
}

// recorded maps a store's ErrNotReserved to idem.ErrAlreadySettled: the reservation is gone because another
// worker recorded this operation's outcome first.
func recorded(err error) error {
	if errors.Is(err, ErrNotReserved) {
		return fmt.Errorf("%w: %w", idem.ErrAlreadySettled, err)
	}
	return err
}

func withResource(res idem.Result, typ, id string) idem.Result {
	res.Resource = &opstatus.Resource{Type: typ, ID: id}
	return res
}
