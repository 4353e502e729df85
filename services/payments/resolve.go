package payments

import (
	"context"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/pkg/resolution"
)

// Resolvers returns what carries a person's decision on an unknown payments operation into the intent and
// refund rows (package resolution): failed releases the reservation as a refused call does (settle.go);
// succeeded records the effect as its provider answer would have. A decision is refused while the provider has
// a record of the call (unlessRecorded).
func (s *Server) Resolvers() map[string]resolution.Resolver {
	return map[string]resolution.Resolver{
		KindCreateIntent: s.unlessRecorded(s.resolveCreate),
		KindCapture:      s.unlessRecorded(s.resolveCapture),
		KindCancel:       s.unlessRecorded(s.resolveCancel),
		KindRefund:       s.unlessRecorded(s.resolveRefund),
	}
}

// unlessRecorded refuses a decision on an operation whose call the provider has a record of: the provider says
// what it did, and the reconciler records exactly that, where a person's decision could record something else
// (a capture decided failed that the provider made). When the provider cannot be asked, or has no record, the
// person decides.
func (s *Server) unlessRecorded(resolve resolution.ResolverFunc) resolution.ResolverFunc {
	return func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, d opstatus.Decision) error {
		if key, res, err := s.lookup(ctx, op); err == nil && res.Found {
			return problem.New("invalid_state",
				"the payment provider has a record of operation %s's call (%s): its reconciler records what the provider did; nothing was decided",
				op.ID, key).With("state", op.State).With("operation_id", op.ID).With("provider_record", true)
		}
		return resolve(ctx, tx, op, d)
	}
}

func (s *Server) resolveCreate(ctx context.Context, tx *gorm.DB, op opstatus.Operation, d opstatus.Decision) error {
	if d.State == opstatus.StateFailed {
		_, err := s.cfg.Store.AuthorizationFailed(ctx, tx, op.AccountID, op.ID)
		return err
	}
	// A later capture is sent against the provider's authorization: without its id the intent cannot be used.
	if d.RemoteRef == "" {
		return problem.Validation(problem.FieldError{Field: "remote_ref",
			Message: "is required to decide an authorization succeeded: the provider's authorization id"})
	}
	_, err := s.cfg.Store.Authorized(ctx, tx, op.AccountID, op.ID, d.RemoteRef)
	return err
}

func (s *Server) resolveCapture(ctx context.Context, tx *gorm.DB, op opstatus.Operation, d opstatus.Decision) error {
	if d.State == opstatus.StateFailed {
		_, err := s.cfg.Store.Release(ctx, tx, op.AccountID, op.ID)
		return err
	}
	// The amount captured is in the provider's answer, which the decision does not carry; a partial capture
	// recorded as the full amount would let refunds exceed what was taken.
	return problem.New("invalid_state",
		"a capture cannot be decided succeeded here: the amount captured is unknown; retry the capture with its Idempotency-Key once the provider answers lookups, or decide it failed").
		With("state", op.State).With("operation_id", op.ID)
}

func (s *Server) resolveCancel(ctx context.Context, tx *gorm.DB, op opstatus.Operation, d opstatus.Decision) error {
	var err error
	if d.State == opstatus.StateFailed {
		_, err = s.cfg.Store.Release(ctx, tx, op.AccountID, op.ID)
	} else {
		_, err = s.cfg.Store.Canceled(ctx, tx, op.AccountID, op.ID)
	}
	return err
}

func (s *Server) resolveRefund(ctx context.Context, tx *gorm.DB, op opstatus.Operation, d opstatus.Decision) error {
	var err error
	if d.State == opstatus.StateFailed {
		_, err = s.cfg.Store.RefundFailed(ctx, tx, op.AccountID, op.ID)
	} else {
		_, err = s.cfg.Store.RefundSucceeded(ctx, tx, op.AccountID, op.ID, d.RemoteRef)
	}
	return err
}
