package deploys_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// queue posts a deploy as c to environment and returns it (queued).
func queue(t *testing.T, c *apitest.Client, environment, key string, n int) deploys.Deploy {
	t.Helper()
	return decodeDeploy(t, c.Post("/v1/deploys", deployBody("api", environment, artifact(n)), apitest.Key(key)).Status(t, 202)).Deploy
}

// runControllers runs ctrls in the background until the test ends.
func runControllers(t *testing.T, ctrls ...*deploys.Controller) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range ctrls {
		wg.Go(func() { c.Run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// waitAllFinal waits until no deploy is queued or running.
func waitAllFinal(t *testing.T, db *gorm.DB) {
	t.Helper()
	servicetest.Eventually(t, "every deploy final", func() bool {
		return count(t, db, `SELECT count(*) FROM deploys WHERE state IN ('queued', 'running')`) == 0
	})
}

// startOrder is the order in which the controllers started deploys: the accounts of the operations' moves from
// queued to running, by event id. Event ids come from one sequence, so they order the starts as committed.
func startOrder(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var accounts []string
	if err := db.Raw(`SELECT account_id FROM operation_events WHERE from_state = 'queued' AND to_state = 'running' ORDER BY id`).Scan(&accounts).Error; err != nil {
		t.Fatal(err)
	}
	return accounts
}

// maxRunningSeen replays the account's state moves in event order and returns the most deploys it ever had
// running at once. A deploy counts from its move from queued to running until it leaves running (or unknown,
// which the reconciler settles). The controller counts running deploys only after the earlier deploy's final move has
// committed, so the replay never sees two at once that were not.
func maxRunningSeen(t *testing.T, db *gorm.DB, account string) int {
	t.Helper()
	var moves []struct {
		Type      string
		FromState *string
		ToState   string
	}
	if err := db.Raw(`SELECT type, from_state, to_state FROM operation_events
WHERE account_id = ? AND to_state IS NOT NULL ORDER BY id`, account).Scan(&moves).Error; err != nil {
		t.Fatal(err)
	}
	running, most := 0, 0
	for _, m := range moves {
		switch {
		case m.FromState == nil || m.Type == opstore.EventCompleted:
			// The request's own claim (running) and its 202 (queued): no controller involved.
		case *m.FromState == "queued" && m.ToState == "running":
			running++
		case (*m.FromState == "running" || *m.FromState == "unknown") && m.ToState != "unknown":
			running--
		}
		most = max(most, running)
	}
	return most
}

// TestOneAccountsBurstDoesNotStarveAnother is the starvation case of issue 13: account A queues 20 deploys to
// 20 environments, then account B queues one; B's deploy starts before A's queue drains: at most one of A's
// deploys starts before it. With two workers and a cap of 1 (the setting) the cap alone keeps a worker
// for B; with one worker, or a cap that lets A fill every worker, it is the round robin: A has started, B has
// not, so B goes next.
func TestOneAccountsBurstDoesNotStarveAnother(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ workers, maxRunning int }{{2, 1}, {2, 2}, {1, 1}} {
		t.Run(fmt.Sprintf("%d workers cap %d", tc.workers, tc.maxRunning), func(t *testing.T) {
			t.Parallel()
			b := setup(t, options{maxRunning: tc.maxRunning})
			b.ctrl.Workers = tc.workers
			other := b.agent.As(servicetest.OtherAgentSecret)
			for i := range 20 {
				queue(t, b.agent, fmt.Sprintf("env-%02d", i), fmt.Sprintf("a-%d", i), i)
			}
			theirs := queue(t, other, "staging", "b-0", 100)

			runControllers(t, b.ctrl)
			waitAllFinal(t, b.db)

			order := startOrder(t, b.db)
			if len(order) != 21 {
				t.Fatalf("%d starts, want 21: %v", len(order), order)
			}
			before := 0
			for _, account := range order {
				if account == servicetest.AccountOther {
					break
				}
				before++
			}
			if before > 1 {
				t.Fatalf("account B's deploy started after %d of A's deploys (order %v); want at most 1", before, order)
			}
			if most := maxRunningSeen(t, b.db, servicetest.AccountDemo); most > tc.maxRunning {
				t.Fatalf("account A had %d deploys running at once, cap %d", most, tc.maxRunning)
			}
			if s := waitFinal(t, other, theirs.ID); s.State != deploys.StateSucceeded {
				t.Fatalf("B's deploy ended %s", s.State)
			}
			if n := count(t, b.db, `SELECT count(*) FROM deploys WHERE state = 'succeeded'`); n != 21 {
				t.Fatalf("%d deploys succeeded, want 21", n)
			}
		})
	}
}

// TestClaimHonoursPerAccountCapAndRoundRobin drives the claim by hand: with a cap of 2, claims alternate
// between the accounts, stop at A's cap although A still has work queued, and resume when one of A's ends.
func TestClaimHonoursPerAccountCapAndRoundRobin(t *testing.T) {
	t.Parallel()
	b := setup(t, options{maxRunning: 2})
	other := b.agent.As(servicetest.OtherAgentSecret)
	var mine []deploys.Deploy
	for i := range 4 {
		mine = append(mine, queue(t, b.agent, fmt.Sprintf("env-%d", i), fmt.Sprintf("a-%d", i), i))
	}
	queue(t, other, "staging", "b-0", 100)

	claim := func() (deploys.Claim, bool) {
		t.Helper()
		var c deploys.Claim
		var ok bool
		err := b.db.Transaction(func(tx *gorm.DB) error {
			var err error
			c, ok, err = b.store.ClaimQueued(t.Context(), tx, 2, time.Now().Add(time.Minute), "worker:test")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return c, ok
	}
	var got []string
	for range 3 {
		c, ok := claim()
		if !ok {
			t.Fatalf("nothing claimed after %v", got)
		}
		got = append(got, c.Deploy.AccountID+"/"+c.Deploy.ID)
	}
	want := []string{servicetest.AccountDemo + "/" + mine[0].ID, servicetest.AccountOther + "/", servicetest.AccountDemo + "/" + mine[1].ID}
	if got[0] != want[0] || got[2] != want[2] || got[1][:len(want[1])] != want[1] {
		t.Fatalf("claims %v, want A's oldest, B's, A's next", got)
	}
	if c, ok := claim(); ok {
		t.Fatalf("claimed %s/%s with A at its cap of 2 running", c.Deploy.AccountID, c.Deploy.ID)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys WHERE account_id = ? AND state = 'queued'`, servicetest.AccountDemo); n != 2 {
		t.Fatalf("A has %d deploys queued, want 2", n)
	}

	// One of A's running deploys ends (cancelled before activation): A may start its next one.
	b.agent.Post("/v1/deploys/"+mine[0].ID+"/cancel", nil).Status(t, 200)
	c, ok := claim()
	if !ok || c.Deploy.ID != mine[2].ID {
		t.Fatalf("after a cancel: claimed %v %s, want %s", ok, c.Deploy.ID, mine[2].ID)
	}
	if _, ok := claim(); ok {
		t.Fatal("claimed past A's cap again")
	}
}

// TestQueueTimeoutFailsTheDeployAndFreesItsLock: a deploy queued longer than the queue timeout fails with
// reason queue_timeout, recorded on its operation; its environment takes a new deploy at once. A recent
// deploy is left alone.
func TestQueueTimeoutFailsTheDeployAndFreesItsLock(t *testing.T) {
	t.Parallel()
	b := setup(t, options{queueTimeout: time.Hour})
	first := b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("old")).Status(t, 202)
	old := decodeDeploy(t, first).Deploy
	recent := queue(t, b.agent, "qa", "recent", 2)
	// The old deploy entered the queue two hours ago (the test moves the clock of its row, not the process's).
	if err := b.db.Exec(`UPDATE deploys SET queued_at = now() - interval '2 hours' WHERE id = ?`, old.ID).Error; err != nil {
		t.Fatal(err)
	}
	// While it waits, its lock refuses every other deploy of staging.
	b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(3)), apitest.Key("blocked")).Status(t, 409)

	n, err := b.ctrl.ExpireQueued(t.Context())
	if err != nil || n != 1 {
		t.Fatalf("ExpireQueued = %d, %v; want 1", n, err)
	}
	s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+old.ID).Status(t, 200))
	if s.State != deploys.StateFailed || s.FinishedAt == nil || s.StartedAt != nil {
		t.Fatalf("expired deploy: state %s started %v finished %v", s.State, s.StartedAt, s.FinishedAt)
	}
	var op opstatus.Operation
	b.agent.Get("/v1/operations/"+old.OperationID).Status(t, 200).Decode(t, &op)
	last := op.Events[len(op.Events)-1]
	if op.State != opstatus.StateFailed || last.Type != opstore.EventFailed || last.FromState != opstatus.StateQueued ||
		detailReason(t, last.Detail) != opstore.ReasonQueueTimeout {
		t.Fatalf("operation %s, last event %s %s->%s %s", op.State, last.Type, last.FromState, last.ToState, last.Detail)
	}
	var tl opstatus.Timeline
	b.agent.Get("/v1/operations/"+old.OperationID+"/timeline").Status(t, 200).Decode(t, &tl)
	if e := tl.Entries[len(tl.Entries)-1]; e.Reason != opstore.ReasonQueueTimeout || e.ToState != opstatus.StateFailed {
		t.Fatalf("timeline ends with %+v", e)
	}
	if finalEvents(t, b.db, old.OperationID) != 1 {
		t.Fatal("the expired operation has more than one final event")
	}

	// The lock is free: a new deploy of staging is accepted; the recent deploy still waits in the queue.
	if env := environment(t, b.agent, "staging"); env.Lock != nil {
		t.Fatalf("staging still locked by %s", env.Lock.HolderDeployID)
	}
	b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(3)), apitest.Key("after")).Status(t, 202)
	if s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+recent.ID).Status(t, 200)); s.State != deploys.StateQueued {
		t.Fatalf("the recent deploy is %s, want queued", s.State)
	}
	// A retry of the original request replays its acceptance, whose Location now tells the end.
	replay := b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("old")).Status(t, 202)
	if replay.Header.Get("Idempotent-Replayed") != "true" || replay.Header.Get("Operation-Id") != old.OperationID {
		t.Fatalf("retry of the expired deploy's request: %v %s", replay.Header, replay.Body)
	}
	if n, err := b.ctrl.ExpireQueued(t.Context()); err != nil || n != 0 {
		t.Fatalf("second ExpireQueued = %d, %v; want 0", n, err)
	}
}

// TestQueueTimeoutRacingReplicasFailEachDeployOnce: four replicas expire the same old deploys at once; each
// deploy is failed by exactly one of them.
func TestQueueTimeoutRacingReplicasFailEachDeployOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{queueTimeout: time.Hour})
	var ops []string
	for i := range 12 {
		ops = append(ops, queue(t, b.agent, fmt.Sprintf("env-%02d", i), fmt.Sprintf("k-%d", i), i).OperationID)
	}
	if err := b.db.Exec(`UPDATE deploys SET queued_at = now() - interval '2 hours'`).Error; err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	start := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			<-start
			n, err := b.ctrl.ExpireQueued(context.Background())
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if total != 12 {
		t.Fatalf("replicas expired %d deploys between them, want 12", total)
	}
	for _, op := range ops {
		if n := finalEvents(t, b.db, op); n != 1 {
			t.Fatalf("operation %s has %d final events", op, n)
		}
	}
	if n := count(t, b.db, `SELECT count(*) FROM environment_locks WHERE holder_deploy_id IS NOT NULL`); n != 0 {
		t.Fatalf("%d locks still held", n)
	}
}

// TestRacingControllersRunEachDeployOnce: three controllers (as three replicas would run them) share the queue
// of two accounts; every deploy runs exactly once (one start, one activation call) and no account ever has
// more deploys running than its cap.
func TestRacingControllersRunEachDeployOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{maxRunning: 2})
	other := b.agent.As(servicetest.OtherAgentSecret)
	var ops []string
	for i := range 8 {
		ops = append(ops, queue(t, b.agent, fmt.Sprintf("env-%d", i), fmt.Sprintf("a-%d", i), i).OperationID)
		ops = append(ops, queue(t, other, fmt.Sprintf("env-%d", i), fmt.Sprintf("b-%d", i), 100+i).OperationID)
	}
	replicas := []*deploys.Controller{b.ctrl}
	for range 2 {
		c := *b.ctrl
		replicas = append(replicas, &c)
	}
	runControllers(t, replicas...)
	waitAllFinal(t, b.db)

	if n := count(t, b.db, `SELECT count(*) FROM deploys WHERE state = 'succeeded'`); n != 16 {
		t.Fatalf("%d deploys succeeded, want 16", n)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploy_target_activations WHERE calls = 1`); n != 16 {
		t.Fatalf("%d deploys activated exactly once, want 16", n)
	}
	for _, op := range ops {
		if n := count(t, b.db, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND from_state = 'queued' AND to_state = 'running'`, op); n != 1 {
			t.Fatalf("operation %s started %d times", op, n)
		}
	}
	for _, account := range []string{servicetest.AccountDemo, servicetest.AccountOther} {
		if most := maxRunningSeen(t, b.db, account); most > 2 {
			t.Fatalf("account %s had %d deploys running at once, cap 2", account, most)
		}
	}
}

// detailReason is the reason in an event's detail.
func detailReason(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var d struct{ Reason string }
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	return d.Reason
}

// TestControllerRunsTheQueueTimeout: the controller's own loop fails a deploy that waits too long, even while
// every deploy it may run is busy. Account A may run one deploy at a time; its second waits behind a first of
// two 1.5 s steps, far beyond the 500 ms queue timeout (which the first, claimed within a poll, never reaches).
func TestControllerRunsTheQueueTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, options{background: true, stepDuration: 1500 * time.Millisecond, queueTimeout: 500 * time.Millisecond})
	first := queue(t, b.agent, "env-1", "first", 1)
	servicetest.Eventually(t, "first deploy running", func() bool {
		return decodeDeploy(t, b.agent.Get("/v1/deploys/"+first.ID).Status(t, 200)).State == deploys.StateRunning
	})
	second := queue(t, b.agent, "env-2", "second", 2)
	s := waitFinal(t, b.agent, second.ID)
	if s.State != deploys.StateFailed || s.StartedAt != nil {
		t.Fatalf("the waiting deploy ended %s (started %v), want failed without starting", s.State, s.StartedAt)
	}
	if last := s.History[len(s.History)-1]; detailReason(t, last.Detail) != opstore.ReasonQueueTimeout {
		t.Fatalf("its last event: %s %s", last.Type, last.Detail)
	}
	if s := waitFinal(t, b.agent, first.ID); s.State != deploys.StateSucceeded {
		t.Fatalf("the running deploy ended %s; the queue timeout must not touch it", s.State)
	}
}
