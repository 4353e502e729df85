package deploys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Controller is the background worker that runs queued deploys: it claims one (FOR UPDATE SKIP LOCKED, so
// several controllers can share the queue; fairly, see below), runs its simulated steps while renewing the leases of the release
// lock and of the operation, activates it on the target and records the outcome. Every write carries the
// deploy's fencing token: once the lock has been taken over, or the deploy cancelled, the write matches nothing
// and the worker stops.
//
// If the process dies the leases run out: opstatus's recovery worker marks the operation unknown and the
// Reconciler settles it from the target's marker.
//
// Accounts share the workers fairly: at most MaxRunningPerAccount deploys of one account run at once, and the
// next deploy to start belongs to the account with queued work whose last start is oldest, so one account's
// burst of deploys cannot hold the others in the queue. A deploy still queued after QueueTimeout fails with
// reason queue_timeout and frees its environment's lock, so a lock held by a queued deploy is bounded too.
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
	// MaxRunningPerAccount caps the deploys of one account that run at once, across every controller sharing
	// the database.
	MaxRunningPerAccount int
	// QueueTimeout is how long a deploy may wait in the queue; ExpireQueued, run every PollInterval, fails
	// the deploys that waited longer.
	QueueTimeout time.Duration
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
	// The queue timeout runs beside the workers, not between their deploys: when every worker is busy (the
	// case it is for) it must still fire.
	wg.Go(func() { c.expireQueued(ctx) })
	wg.Wait()
}

func (c *Controller) expireQueued(ctx context.Context) {
	for ctx.Err() == nil {
		if _, err := c.ExpireQueued(ctx); err != nil && ctx.Err() == nil {
			c.Logger.WarnContext(ctx, "deploy queue timeout pass failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.PollInterval):
		}
	}
}

// expireBatch is how many deploys one transaction of ExpireQueued fails.
const expireBatch = 100

// ExpireQueued fails every deploy queued for longer than QueueTimeout (reason queue_timeout) and frees its
// environment's lock; it returns how many it failed. Several replicas may run it at once: each deploy is
// failed by exactly one of them (see Store.ExpireQueued).
func (c *Controller) ExpireQueued(ctx context.Context) (int, error) {
	detail := map[string]any{"reason": opstore.ReasonQueueTimeout, "queue_timeout_seconds": c.QueueTimeout.Seconds()}
	total := 0
	for {
		var expired []Deploy
		err := c.tx(ctx, func(tx *gorm.DB) error {
			var err error
			expired, err = c.Store.ExpireQueued(ctx, tx, time.Now().Add(-c.QueueTimeout), expireBatch, controllerActor, detail)
			return err
		})
		if err != nil {
			return total, err
		}
		for _, d := range expired {
			c.Logger.InfoContext(ctx, "deploy failed: queued too long", "deploy_id", d.ID, "operation_id", d.OperationID,
				"environment", d.Environment, "reason", opstore.ReasonQueueTimeout)
			opstatus.ObserveFinished(c.Observer, d.OperationKind(), StateFailed)
		}
		total += len(expired)
		if len(expired) < expireBatch {
			return total, nil
		}
	}
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

// RunOnce claims one queued deploy and runs it to its end; ran is false when nothing could start (nothing
// queued, or every account with queued work at its MaxRunningPerAccount).
func (c *Controller) RunOnce(ctx context.Context) (ran bool, err error) {
	var claim Claim
	var ok bool
	claimedUntil := c.leaseUntil()
	err = c.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		claim, ok, err = c.Store.ClaimQueued(ctx, tx, max(c.MaxRunningPerAccount, 1), claimedUntil, controllerActor)
		return err
	})
	if err != nil || !ok {
		return false, err
	}
	log := c.Logger.With("deploy_id", claim.Deploy.ID, "operation_id", claim.Deploy.OperationID,
		"environment", claim.Deploy.Environment, "fencing_token", claim.Token)
	log.InfoContext(ctx, "deploy started")
	r := &run{claim: claim, leaseEnd: claimedUntil, log: log}
	switch err := c.execute(ctx, r); {
	case errors.Is(err, ErrLockLost):
		// Cancelled, or taken over after our lease ran out: whoever did it owns the deploy now.
		log.InfoContext(ctx, "deploy no longer ours; stopped", "reason", err.Error())
	case err != nil:
		// The leases run out and the reconciler settles the deploy from the target's marker.
		log.WarnContext(ctx, "deploy interrupted; left to the reconciler", "error", err.Error())
	}
	return true, nil
}

// run is one deploy in the hands of this controller: its claim and how long the leases last that its last
// successful write took.
type run struct {
	claim    Claim
	leaseEnd time.Time
	log      *slog.Logger
}

func (c *Controller) execute(ctx context.Context, r *run) error {
	claim := r.claim
	for step := 1; step <= claim.Deploy.StepsTotal; step++ {
		if err := c.wait(ctx, r, c.StepDuration); err != nil {
			return c.stop(ctx, claim, err)
		}
		if err := c.write(ctx, r, "complete step", func(ctx context.Context, tx *gorm.DB, until time.Time) error {
			return c.Store.CompleteStep(ctx, tx, claim, step, until, controllerActor)
		}); err != nil {
			return c.stop(ctx, claim, err)
		}
	}
	if err := c.write(ctx, r, "begin activation", func(ctx context.Context, tx *gorm.DB, until time.Time) error {
		err := c.Store.BeginActivation(ctx, tx, claim, until, controllerActor)
		if errors.Is(err, ErrLockLost) {
			// An earlier attempt may have committed although its answer was lost: then activation has begun
			// under our token and the lock is still ours, which is success.
			return c.activationBegun(ctx, tx, claim, until, err)
		}
		return err
	}); err != nil {
		return c.stop(ctx, claim, err)
	}

	// The point of no return: finish what was started even if ctx ends now. Only waiting for a target that
	// could not be reached still stops with the controller (stopping).
	stopping := ctx
	ctx = context.WithoutCancel(ctx)
	marker, err := c.activate(ctx, stopping, r)
	if errors.Is(err, ErrFenced) {
		return ErrLockLost
	}
	if errors.Is(err, ErrActivationFailed) {
		// The target answered: nothing is live. The deploy fails, its lock released, and says why.
		if ferr := c.retry(ctx, r, "finish", func(ctx context.Context) error {
			return c.tx(ctx, func(tx *gorm.DB) error {
				return c.Store.Finish(ctx, tx, claim, false, controllerActor, opstore.EventFailed,
					map[string]any{"reason": opstore.ReasonActivationFailed, "fencing_token": claim.Token})
			})
		}); ferr != nil {
			return ferr
		}
		opstatus.ObserveFinished(c.Observer, claim.Deploy.OperationKind(), StateFailed)
		return nil
	}
	if err != nil {
		return err
	}
	if err := c.retry(ctx, r, "finish", func(ctx context.Context) error {
		return c.tx(ctx, func(tx *gorm.DB) error {
			return c.Store.Finish(ctx, tx, claim, true, controllerActor, EventActivated, map[string]any{"marker": marker})
		})
	}); err != nil {
		return err
	}
	opstatus.ObserveFinished(c.Observer, claim.Deploy.OperationKind(), StateSucceeded)
	return nil
}

// notSentBackoff bounds the wait between activations that never reached the target.
const notSentBackoff = 5 * time.Second

// activate calls the target, each call recorded as a dispatch: dispatch_started committed before it, then what
// was observed. An activation that never reached the target (NotReachedError) is safe to send again with the
// same fencing token, so it is, after a backoff during which the leases are renewed: the deploy goes on, never
// failed for it. It stops when the target answers, when the lock is lost (cancelled, taken over), or when
// stopping ends (the controller shuts down: the leases then run out and the reconciler settles the deploy from
// the target's marker).
func (c *Controller) activate(ctx, stopping context.Context, r *run) (Activation, error) {
	claim := r.claim
	backoff := 20 * time.Millisecond
	for {
		failpoint.Hit(FailpointBeforeActivate)
		call := map[string]any{"target": "deploy_target", "call": "activate", "deploy_id": claim.Deploy.ID, "fencing_token": claim.Token}
		if err := c.retry(ctx, r, "record dispatch", func(ctx context.Context) error {
			return opstatus.Append(ctx, database.SQL(c.DB), claim.Deploy.AccountID, claim.Deploy.OperationID, opstore.EventDispatchStarted, controllerActor, call)
		}); err != nil {
			// Without the record of the dispatch the call is not made; the lease runs out and the reconciler,
			// finding no marker, settles the deploy.
			return Activation{}, err
		}
		var marker Activation
		err := c.retry(ctx, r, "activate", func(ctx context.Context) error {
			// The target activates a deploy at most once and refuses stale tokens, so asking again is safe.
			var err error
			marker, err = c.Target.Activate(ctx, claim.Deploy, claim.Token)
			return err
		})
		failpoint.Hit(FailpointAfterActivate)
		c.recordDispatch(ctx, claim, call, marker, err)
		if !errors.Is(err, ErrNotReached) {
			return marker, err
		}
		r.log.WarnContext(ctx, "deploy target not reached; activating again with the same fencing token",
			"retry_in", backoff.String(), "error", err.Error())
		if werr := c.wait(stopping, r, backoff); werr != nil {
			return Activation{}, errors.Join(err, werr)
		}
		backoff = min(backoff*2, notSentBackoff)
	}
}

// activationBegun is BeginActivation's answer to a retry: lost is returned unless the deploy's activation has
// already begun and a renewal under its token still succeeds.
func (c *Controller) activationBegun(ctx context.Context, tx *gorm.DB, claim Claim, until time.Time, lost error) error {
	d, err := c.Store.Deploy(ctx, tx, claim.Deploy.AccountID, claim.Deploy.ID)
	if err != nil || d.ActivationStarted == nil || d.State != StateRunning {
		return lost
	}
	if err := c.Store.Renew(ctx, tx, claim, until); err != nil {
		return lost
	}
	return nil
}

// write runs one fenced write of the deploy in a transaction, renewing the leases to a fresh deadline, and
// retries it (retry) while the database is unavailable.
func (c *Controller) write(ctx context.Context, r *run, what string, fn func(ctx context.Context, tx *gorm.DB, until time.Time) error) error {
	return c.retry(ctx, r, what, func(ctx context.Context) error {
		until := c.leaseUntil()
		if err := c.tx(ctx, func(tx *gorm.DB) error { return fn(ctx, tx, until) }); err != nil {
			return err
		}
		r.leaseEnd = until
		return nil
	})
}

// retry runs do until it succeeds or fails for good. A database that is unavailable (a restart, a cut
// connection) is waited out with backoff for as long as the leases this controller holds last: until then no
// one else may take the deploy over, so trying again is safe and giving up would fail a healthy deploy. Only
// a lost lease (ErrLockLost: the fencing token no longer matches), another kind of error, the end of ctx or
// the end of the lease stop it.
func (c *Controller) retry(ctx context.Context, r *run, what string, do func(ctx context.Context) error) error {
	backoff := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := do(ctx)
		if err == nil || !problem.IsStoreUnavailable(err) || ctx.Err() != nil {
			return err
		}
		wait := min(backoff, max(c.Heartbeat, 20*time.Millisecond))
		backoff *= 2
		// Leave the last part of the lease to the reconciler's judgement rather than write into it.
		if time.Now().Add(wait).After(r.leaseEnd.Add(-wait)) {
			return fmt.Errorf("deploys: %s: the database stayed unavailable until the lease ran out: %w", what, err)
		}
		r.log.WarnContext(ctx, "deploy write failed; retrying within the lease", "write", what, "attempt", attempt,
			"retry_in", wait.String(), "lease_left", time.Until(r.leaseEnd).String(), "error", err.Error())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// recordDispatch records what the controller observed of its activation call: not_sent when it never reached
// the target, execution_error when the target answered that the activation failed, response_received for an
// activation or a fenced refusal, and sent_no_response for any other error (the simulated target answers
// through the database, so a failed call may have committed there).
func (c *Controller) recordDispatch(ctx context.Context, claim Claim, call map[string]any, marker Activation, err error) {
	event := opstore.EventDispatchResponseReceived
	var notReached *NotReachedError
	switch {
	case errors.Is(err, ErrFenced):
		call["state"], call["result"] = "response_received", "fenced"
	case errors.As(err, &notReached):
		event = opstore.EventDispatchNotSent
		call["state"], call["reason"] = "not_sent", notReached.Reason
	case errors.Is(err, ErrActivationFailed):
		event = opstore.EventDispatchExecutionError
		call["state"], call["reason"] = "execution_error", opstore.ReasonActivationFailed
	case err != nil:
		event = opstore.EventDispatchSentNoResponse
		call["state"], call["reason"] = "sent_no_response", opstore.ReasonTargetError
	default:
		call["state"], call["result"], call["remote_ref"] = "response_received", "activated", marker.DeployID
		// The target counts calls per deploy: more than one means it answered from its earlier activation.
		call["replayed"] = marker.Calls > 1
	}
	if rerr := opstatus.Append(ctx, database.SQL(c.DB), claim.Deploy.AccountID, claim.Deploy.OperationID, event, controllerActor, call); rerr != nil {
		c.Logger.WarnContext(ctx, "dispatch outcome not recorded", "deploy_id", claim.Deploy.ID, "error", rerr.Error())
	}
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
func (c *Controller) wait(ctx context.Context, r *run, d time.Duration) error {
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
			if err := c.write(ctx, r, "heartbeat", func(ctx context.Context, tx *gorm.DB, until time.Time) error {
				return c.Store.Renew(ctx, tx, r.claim, until)
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
