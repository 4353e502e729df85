package deploys

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// Controller is the background worker that runs queued deploys: it claims one (FOR UPDATE SKIP LOCKED, so
// several controllers can share the queue), runs its simulated steps while renewing the leases of the release
// lock and of the operation, activates it on the target and records the outcome. Every write carries the
// deploy's fencing token: once the lock has been taken over, or the deploy cancelled, the write matches nothing
// and the worker stops.
//
// If the process dies the leases run out: opstatus's recovery worker marks the operation unknown and the
// Reconciler settles it from the target's marker.
type Controller struct {
	DB     *gorm.DB
	Store  Store
	Target Target
	Logger *slog.Logger
	// Steps simulated steps of StepDuration each run before activation.
	Steps        int
	StepDuration time.Duration
	// Lease is how long the lock and the operation stay ours without a heartbeat; Heartbeat must be well
	// below it.
	Lease     time.Duration
	Heartbeat time.Duration
	// PollInterval is how often an idle worker looks for queued deploys; Workers is how many deploys (of
	// different environments) run at once.
	PollInterval time.Duration
	Workers      int
	// Observer, when set, is told of every deploy the controller finishes (metrics).
	Observer opstatus.Observer
}

const controllerActor = "system:deploys.controller"

// Failpoints of the controller, for crash tests.
const (
	FailpointBeforeActivate = "deploys.before_activate"
	FailpointAfterActivate  = "deploys.after_activate"
)

// Run works until ctx ends, then returns once every worker has stopped.
func (c *Controller) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range max(c.Workers, 1) {
		wg.Go(func() { c.work(ctx) })
	}
	wg.Wait()
}

func (c *Controller) work(ctx context.Context) {
	for ctx.Err() == nil {
		ran, err := c.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			c.Logger.WarnContext(ctx, "deploy controller pass failed", "error", err.Error())
		}
		if ran {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.PollInterval):
		}
	}
}

// RunOnce claims one queued deploy and runs it to its end; ran is false when nothing was queued.
func (c *Controller) RunOnce(ctx context.Context) (ran bool, err error) {
	var claim Claim
	var ok bool
	err = c.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		claim, ok, err = c.Store.ClaimQueued(ctx, tx, c.leaseUntil(), controllerActor)
		return err
	})
	if err != nil || !ok {
		return false, err
	}
	log := c.Logger.With("deploy_id", claim.Deploy.ID, "operation_id", claim.Deploy.OperationID,
		"environment", claim.Deploy.Environment, "fencing_token", claim.Token)
	log.InfoContext(ctx, "deploy started")
	switch err := c.execute(ctx, claim); {
	case errors.Is(err, ErrLockLost):
		// Cancelled, or taken over after our lease ran out: whoever did it owns the deploy now.
		log.InfoContext(ctx, "deploy no longer ours; stopped", "reason", err.Error())
	case err != nil:
		// The leases run out and the reconciler settles the deploy from the target's marker.
		log.WarnContext(ctx, "deploy interrupted; left to the reconciler", "error", err.Error())
	}
	return true, nil
}

func (c *Controller) execute(ctx context.Context, claim Claim) error {
	for step := 1; step <= claim.Deploy.StepsTotal; step++ {
		if err := c.wait(ctx, claim, c.StepDuration); err != nil {
			return c.stop(ctx, claim, err)
		}
		if err := c.tx(ctx, func(tx *gorm.DB) error {
			return c.Store.CompleteStep(ctx, tx, claim, step, c.leaseUntil(), controllerActor)
		}); err != nil {
			return c.stop(ctx, claim, err)
		}
	}
	if err := c.tx(ctx, func(tx *gorm.DB) error {
		return c.Store.BeginActivation(ctx, tx, claim, c.leaseUntil(), controllerActor)
	}); err != nil {
		return c.stop(ctx, claim, err)
	}

	// The point of no return: finish what was started even if ctx ends now.
	ctx = context.WithoutCancel(ctx)
	failpoint.Hit(FailpointBeforeActivate)
	marker, err := c.Target.Activate(ctx, claim.Deploy, claim.Token)
	failpoint.Hit(FailpointAfterActivate)
	if errors.Is(err, ErrFenced) {
		return ErrLockLost
	}
	if err != nil {
		return err
	}
	if err := c.tx(ctx, func(tx *gorm.DB) error {
		return c.Store.Finish(ctx, tx, claim, true, controllerActor, EventActivated, map[string]any{"marker": marker})
	}); err != nil {
		return err
	}
	opstatus.ObserveFinished(c.Observer, claim.Deploy.OperationKind(), StateSucceeded)
	return nil
}

// stop handles an error before activation: a controller shutting down puts the deploy back in the queue, so a
// restart runs it instead of the reconciler failing it.
func (c *Controller) stop(ctx context.Context, claim Claim, err error) error {
	if ctx.Err() == nil || errors.Is(err, ErrLockLost) {
		return err
	}
	requeueCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if rerr := c.tx(requeueCtx, func(tx *gorm.DB) error {
		return c.Store.Requeue(requeueCtx, tx, claim, controllerActor)
	}); rerr != nil {
		return errors.Join(err, rerr)
	}
	c.Logger.InfoContext(requeueCtx, "deploy requeued at shutdown", "deploy_id", claim.Deploy.ID)
	return nil
}

// wait sleeps d while renewing the leases every Heartbeat.
func (c *Controller) wait(ctx context.Context, claim Claim, d time.Duration) error {
	done := time.NewTimer(d)
	defer done.Stop()
	beat := time.NewTicker(max(c.Heartbeat, time.Millisecond))
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done.C:
			return nil
		case <-beat.C:
			if err := c.tx(ctx, func(tx *gorm.DB) error {
				return c.Store.Renew(ctx, tx, claim, c.leaseUntil())
			}); err != nil {
				return err
			}
		}
	}
}

func (c *Controller) tx(ctx context.Context, fn func(tx *gorm.DB) error) error {
	return c.DB.WithContext(ctx).Transaction(fn)
}

func (c *Controller) leaseUntil() time.Time { return time.Now().Add(c.Lease) }
