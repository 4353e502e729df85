package deploys

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// Reconciler settles deploys whose operation became unknown (their controller died, its leases ran out) from
// the target's marker: activated means succeeded (the environment moves to the deploy, the lock is released);
// not activated means nothing happened there, so the deploy is queued again under the same operation, keeping
// its lock, until it has run MaxAttempts times, and then fails. The evidence is the operation's reconciled (or
// requeued) event.
//
// Before it reads the marker it takes the lock over with a new fencing token and shows that token to the
// target, so the old worker, if it is only slow and not dead, can neither write nor activate any more: the
// marker it reads is final.
type Reconciler struct {
	DB     *gorm.DB
	Store  Store
	Target Target
	// Now is the clock the lease is judged by (time.Now when nil).
	Now func() time.Time
	// Observer, when set, is told of every deploy the reconciler settles (metrics).
	Observer opstatus.Observer
}

var _ opstatus.Reconciler = (*Reconciler)(nil)

const reconcilerActor = "system:deploys.reconciler"

// MaxAttempts is how many times a deploy runs at most: one whose controller died before the target activated it
// is queued again under the same operation (EventRequeued) until it has been claimed MaxAttempts times; the
// reconciler fails it after that.
const MaxAttempts = 3

// EventRequeued records a deploy the reconciler put back in the queue: its worker's lease ran out and the
// target's marker showed nothing activated (detail: the evidence, with max_attempts).
const EventRequeued = "requeued"

// EventTargetLookup records what the deploy target's marker said when the reconciler asked: an observation.
const EventTargetLookup = "target_lookup"

// Reconcile implements opstatus.Reconciler. An error leaves the operation unknown for a later pass.
func (r *Reconciler) Reconcile(ctx context.Context, op opstatus.Operation) error {
	d, err := r.Store.DeployByOperation(ctx, r.DB, op.AccountID, op.ID)
	if err != nil {
		return fmt.Errorf("deploys: reconcile %s: %w", op.ID, err)
	}
	claim, settled, err := r.takeOver(ctx, op, d)
	if err != nil || settled {
		return err
	}
	if err := r.Target.Fence(ctx, d.AccountID, d.Environment, claim.Token); err != nil {
		return err
	}
	marker, activated, err := r.lookUpActivation(ctx, op, d)
	if err != nil {
		return err
	}
	evidence := map[string]any{"target_marker": nil, "fencing_token": claim.Token,
		"activation_started": d.ActivationStarted != nil}
	evidence["reason"] = opstore.ReasonRemoteRecordAbsent
	if activated {
		evidence["target_marker"], evidence["reason"] = marker, opstore.ReasonRemoteRecordFound
	}
	requeued := false
	if err := r.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if !activated {
			// Nothing happened at the target, and the fence keeps the dead worker from doing anything there:
			// the deploy is still intended, so it runs again, up to MaxAttempts times in all.
			evidence["max_attempts"] = MaxAttempts
			var err error
			if requeued, err = r.Store.RequeueLost(ctx, tx, claim, MaxAttempts, reconcilerActor, EventRequeued, evidence); requeued || err != nil {
				return err
			}
		}
		return r.Store.Finish(ctx, tx, claim, activated, reconcilerActor, opstore.EventReconciled, evidence)
	}); err != nil || requeued {
		return err
	}
	state := StateFailed
	if activated {
		state = StateSucceeded
	}
	opstatus.ObserveFinished(r.Observer, op.Kind, state)
	return nil
}

// takeOver takes d's environment lock over with a new fencing token. settled says that d no longer holds the
// lock because its worker or a cancel settled it after the lease ran out: there is nothing to reconcile.
func (r *Reconciler) takeOver(ctx context.Context, op opstatus.Operation, d Deploy) (claim Claim, settled bool, err error) {
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	err = r.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		claim, err = r.Store.TakeOver(ctx, tx, d, now())
		return err
	})
	if errors.Is(err, ErrLockLost) {
		if latest, lerr := r.Store.DeployByOperation(ctx, r.DB, op.AccountID, op.ID); lerr == nil && latest.State != StateUnknown {
			return Claim{}, true, nil
		}
		return Claim{}, false, fmt.Errorf("deploys: reconcile %s: deploy %s is unknown but does not hold its environment's lock", op.ID, d.ID)
	}
	if err != nil {
		return Claim{}, false, fmt.Errorf("deploys: reconcile %s: %w", op.ID, err)
	}
	return claim, false, nil
}

// lookUpActivation asks the target whether d was activated, and records what it said as the operation's
// target_lookup event: a failed lookup too (when someone asked, and that they could not learn).
func (r *Reconciler) lookUpActivation(ctx context.Context, op opstatus.Operation, d Deploy) (Activation, bool, error) {
	marker, activated, err := r.Target.Activation(ctx, d.ID)
	lookup := map[string]any{"target": "deploy_target", "call": "activation", "deploy_id": d.ID}
	if err != nil {
		lookup["result"], lookup["reason"] = "failed", opstore.ReasonTargetError
		if aerr := opstatus.Append(ctx, database.SQL(r.DB), op.AccountID, op.ID, EventTargetLookup, reconcilerActor, lookup); aerr != nil {
			return Activation{}, false, errors.Join(err, aerr)
		}
		return Activation{}, false, err
	}
	lookup["found"], lookup["result"] = activated, "not_found"
	if activated {
		lookup["result"], lookup["marker"] = "found", marker
	}
	if err := opstatus.Append(ctx, database.SQL(r.DB), op.AccountID, op.ID, EventTargetLookup, reconcilerActor, lookup); err != nil {
		return Activation{}, false, err
	}
	return marker, activated, nil
}
