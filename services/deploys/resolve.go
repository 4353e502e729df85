package deploys

import (
	"context"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/resolution"
)

// Resolvers returns what carries a person's decision on an unknown deploy or rollback into the deploy's rows
// (package resolution), as the reconciler does from the target's marker: the lock is taken over with a new
// fencing token, so the deploy's old worker can no longer write, then released; succeeded moves the environment
// to the deploy.
func (s *Service) Resolvers() map[string]resolution.Resolver {
	r := resolution.ResolverFunc(s.resolve)
	return map[string]resolution.Resolver{KindDeploy: r, KindRollback: r}
}

func (s *Service) resolve(ctx context.Context, tx *gorm.DB, op opstatus.Operation, dec opstatus.Decision) error {
	d, err := s.Reconciler.Store.DeployByOperation(ctx, tx, op.AccountID, op.ID)
	if err != nil {
		return err
	}
	now := time.Now()
	claim, err := s.Reconciler.Store.TakeOver(ctx, tx, d, now)
	var live *LeaseLiveError
	switch {
	case errors.As(err, &live):
		// Its worker may still be activating it: the same refusal as any call that may still land.
		return opstatus.CallMayLandProblem(op, live.Until, now).With("deploy_id", d.ID)
	case errors.Is(err, ErrLockLost):
		// The lock went with an earlier settlement; the deploy's rows say what happened, and the decision
		// still records the operation's outcome.
		return nil
	case err != nil:
		return err
	}
	err = s.Reconciler.Store.Settle(ctx, tx, claim, dec.State == opstatus.StateSucceeded)
	if errors.Is(err, ErrLockLost) {
		return nil
	}
	return err
}
