package deploys_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// claimExpired plays a worker that claims the queued deploy and then stalls (a pause, a partition) until its
// leases have run out.
func claimExpired(t *testing.T, b *bundle) deploys.Claim {
	t.Helper()
	var claim deploys.Claim
	err := b.db.Transaction(func(tx *gorm.DB) error {
		var ok bool
		var err error
		claim, ok, err = b.store.ClaimQueued(t.Context(), tx, 1, time.Now().Add(-time.Second), "worker:test")
		if err == nil && !ok {
			err = errors.New("nothing queued")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

func (b *bundle) recover(t *testing.T) {
	t.Helper()
	w := &opstatus.RecoveryWorker{DB: database.SQL(b.db), Logger: servicetest.Logger(),
		Reconcilers: map[string]opstatus.Reconciler{deploys.KindDeploy: b.recon, deploys.KindRollback: b.recon}}
	if settled, err := w.RunOnce(t.Context()); err != nil || settled != 1 {
		t.Fatalf("recovery: settled %d, err %v", settled, err)
	}
}

func reconciledEvidence(t *testing.T, s deploys.Status) map[string]any {
	t.Helper()
	for _, ev := range s.History {
		if ev.Type == opstore.EventReconciled {
			var detail map[string]any
			if err := json.Unmarshal(ev.Detail, &detail); err != nil {
				t.Fatal(err)
			}
			return detail
		}
	}
	t.Fatalf("no reconciled event in %+v", s.History)
	return nil
}

// TestReconcilerFencesOutAStalledWorkerAndRequeuesANeverActivatedDeploy: a worker claims a deploy and stalls
// until its leases run out. The reconciler fences it out and, the target's marker absent, queues the deploy
// again under the same operation; so twice more, and the third time (deploys.MaxAttempts) it fails, with one
// negative marker lookup per attempt and the environment untouched.
func TestReconcilerFencesOutAStalledWorkerAndRequeuesANeverActivatedDeploy(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("k")).Status(t, 202))
	zombie := claimExpired(t, b)
	var s deploys.Status
	for attempt := 1; attempt <= deploys.MaxAttempts; attempt++ {
		if attempt > 1 {
			claimExpired(t, b)
		}
		b.recover(t)
		s = decodeDeploy(t, b.agent.Get("/v1/deploys/"+d.ID).Status(t, 200))
		want, requeues := deploys.StateQueued, 0
		if attempt == deploys.MaxAttempts {
			want = deploys.StateFailed
		}
		for _, ev := range s.History {
			if ev.Type == deploys.EventRequeued {
				requeues++
			}
		}
		if s.State != want || requeues != min(attempt, deploys.MaxAttempts-1) {
			t.Fatalf("after attempt %d: %s with %d requeues; want %s, %d", attempt, s.State, requeues, want, min(attempt, deploys.MaxAttempts-1))
		}
	}
	if ev := reconciledEvidence(t, s); ev["target_marker"] != nil || ev["fencing_token"] != float64(1+deploys.MaxAttempts) {
		t.Fatalf("evidence: %v", ev)
	}
	var lookups int
	for _, ev := range s.History {
		if ev.Type == deploys.EventTargetLookup && strings.Contains(string(ev.Detail), `"result":"not_found"`) {
			lookups++
		}
	}
	if lookups != deploys.MaxAttempts {
		t.Fatalf("%d negative marker lookups recorded; want one per attempt: %+v", lookups, s.History)
	}
	if env := environment(t, b.agent, "staging"); env.Lock != nil || env.Version != 0 {
		t.Fatalf("environment: %+v", env)
	}

	// The stalled worker wakes up: its token is stale, so neither the database nor the target takes its writes.
	ctx := context.Background()
	for name, write := range map[string]func(tx *gorm.DB) error{
		"step": func(tx *gorm.DB) error {
			return b.store.CompleteStep(ctx, tx, zombie, 1, time.Now().Add(time.Minute), "worker:test")
		},
		"activation": func(tx *gorm.DB) error {
			return b.store.BeginActivation(ctx, tx, zombie, time.Now().Add(time.Minute), "worker:test")
		},
		"renew":  func(tx *gorm.DB) error { return b.store.Renew(ctx, tx, zombie, time.Now().Add(time.Minute)) },
		"finish": func(tx *gorm.DB) error { return b.store.Finish(ctx, tx, zombie, true, "worker:test", "activated", nil) },
	} {
		if err := b.db.Transaction(write); !errors.Is(err, deploys.ErrLockLost) {
			t.Errorf("%s by the stalled worker: %v, want ErrLockLost", name, err)
		}
	}
	if _, err := b.target.Activate(ctx, zombie.Deploy, zombie.Token); !errors.Is(err, deploys.ErrFenced) {
		t.Fatalf("activation with a stale token: %v, want ErrFenced", err)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploy_target_activations`); n != 0 {
		t.Fatalf("%d activations, want 0", n)
	}
	if n := finalEvents(t, b.db, d.OperationID); n != 1 {
		t.Fatalf("%d final events, want 1", n)
	}
}

func TestReconcilerSettlesAnActivatedDeployFromTheTargetMarker(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("k")).Status(t, 202))
	// The worker activates, then dies before it records the outcome.
	claim := claimExpired(t, b)
	if _, err := b.target.Activate(t.Context(), claim.Deploy, claim.Token); err != nil {
		t.Fatal(err)
	}
	if s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+d.ID).Status(t, 200)); s.State != deploys.StateRunning {
		t.Fatalf("before recovery: %s", s.State)
	}
	if _, err := (&opstatus.RecoveryWorker{DB: database.SQL(b.db)}).RunOnce(t.Context()); err != nil { // expires the lease; no reconciler
		t.Fatal(err)
	}
	if s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+d.ID).Status(t, 200)); s.State != deploys.StateUnknown {
		t.Fatalf("after the lease ran out: %s, want unknown", s.State)
	}
	// While the deploy is unknown it still holds the lock.
	locked := b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(2)), apitest.Key("k2")).Status(t, 409)
	if locked.Str(t, "holder_deploy_id") != d.ID {
		t.Fatalf("deploy while unknown: %s", locked.Body)
	}

	b.recover(t)
	s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+d.ID).Status(t, 200))
	if s.State != deploys.StateSucceeded {
		t.Fatalf("state %s, want succeeded", s.State)
	}
	marker, _ := reconciledEvidence(t, s)["target_marker"].(map[string]any)
	if marker["deploy_id"] != d.ID || marker["artifact"] != artifact(1) {
		t.Fatalf("evidence marker: %v", marker)
	}
	env := environment(t, b.agent, "staging")
	if env.Lock != nil || env.Version != 1 || *env.CurrentDeployID != d.ID {
		t.Fatalf("environment: %+v", env)
	}
	if m, _, _ := b.target.Activation(t.Context(), d.ID); m.Calls != 1 {
		t.Fatalf("target called %d times", m.Calls)
	}
}

// A controller stopped gracefully (its context ends) mid-step puts the deploy back in the queue rather than
// leaving it to be failed by the reconciler; the next controller runs it.
func TestStoppedControllerRequeuesADeployNotYetActivating(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("k")).Status(t, 202))
	slow := *b.ctrl
	slow.StepDuration = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := slow.RunOnce(ctx); err != nil {
			t.Error(err)
		}
	}()
	servicetest.Eventually(t, "the deploy settles", func() bool {
		return count(t, b.db, `SELECT count(*) FROM deploys WHERE id = ? AND state = 'running'`, d.ID) == 1
	})
	cancel()
	<-done

	s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+d.ID).Status(t, 200))
	if s.State != deploys.StateQueued || s.StartedAt != nil {
		t.Fatalf("after a graceful stop: %+v", s.Deploy)
	}
	if env := environment(t, b.agent, "staging"); env.Lock == nil || env.Lock.HolderDeployID != d.ID || env.Lock.LeaseExpiresAt != nil {
		t.Fatalf("lock after a graceful stop: %+v", env.Lock)
	}
	b.runOnce(t)
	if s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+d.ID).Status(t, 200)); s.State != deploys.StateSucceeded || finalEvents(t, b.db, d.OperationID) != 1 {
		t.Fatalf("after the next controller: %s", s.State)
	}
}
