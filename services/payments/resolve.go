package payments

import (
	"context"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Resolvers returns what carries a person's decision on an unknown payments operation into the intent and
// refund rows (package resolution): failed releases the reservation as a refused call does (settle.go);
// succeeded records the effect as its provider answer would have.
func (s *Server) Resolvers() map[string]opstatus.Resolver {
	return map[string]opstatus.Resolver{
		KindCreateIntent: opstatus.ResolverFunc(s.resolveCreate),
		KindCapture:      opstatus.ResolverFunc(s.resolveCapture),
		KindCancel:       opstatus.ResolverFunc(s.resolveCancel),
		KindRefund:       opstatus.ResolverFunc(s.resolveRefund),
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
	return problem.New(problem.CodeInvalidState,
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
