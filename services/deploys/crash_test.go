package deploys_test

import (
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// TestKilledMidDeployIsReconciledFromTheTargetMarker kills `retrysafe serve deploys` (SIGKILL) while its
// controller is inside a deploy, before or after the target activated it, and restarts it: the deploy is
// settled from the target's marker (activated: succeeded, never run again; not: queued again under the same
// operation and run once by the restarted controller), and the lock is held until then and released after.
func TestKilledMidDeployIsReconciledFromTheTargetMarker(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t)
	for _, tc := range []struct {
		failpoint string
		want      deploys.State
		activated bool
	}{
		{deploys.FailpointBeforeActivate, deploys.StateSucceeded, false},
		{deploys.FailpointAfterActivate, deploys.StateSucceeded, true},
	} {
		t.Run(tc.failpoint, func(t *testing.T) {
			t.Parallel()
			db := testdb.Schema(t)
			env := map[string]string{
				"DATABASE_URL": db.DSN, "DEPLOY_STEPS": "1", "DEPLOY_STEP_DURATION": "50ms",
				"DEPLOY_LOCK_LEASE": "1s", "DEPLOY_HEARTBEAT_INTERVAL": "200ms", "DEPLOY_POLL_INTERVAL": "50ms",
				"RECOVERY_INTERVAL": "200ms",
			}
			crashingEnv := map[string]string{"RETRYSAFE_FAILPOINTS": tc.failpoint + "=pause"}
			for k, v := range env {
				crashingEnv[k] = v
			}
			crashing := proctest.Start(t, bin, []string{"serve", "deploys"}, crashingEnv, "DEPLOYS_ADDR")
			c := apitest.New(t, crashing.URL, servicetest.AgentSecret)
			d := decodeDeploy(t, c.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("k")).Status(t, 202))
			crashing.WaitFor(t, "failpoint "+tc.failpoint+" reached")
			crashing.Kill(t)

			// Dead mid-deploy: the deploy still holds the lock, its operation is running under a lease.
			if n := count(t, db.DB, `SELECT count(*) FROM environment_locks WHERE holder_deploy_id = ?`, d.ID); n != 1 {
				t.Fatal("the killed deploy does not hold the lock")
			}
			if n := count(t, db.DB, `SELECT count(*) FROM operations WHERE id = ? AND state = 'running' AND lease_expires_at IS NOT NULL`, d.OperationID); n != 1 {
				t.Fatal("the killed deploy's operation is not running under a lease")
			}

			restarted := proctest.Start(t, bin, []string{"serve", "deploys"}, env, "DEPLOYS_ADDR")
			c = apitest.New(t, restarted.URL, servicetest.AgentSecret)
			final := waitFinal(t, c, d.ID)
			if final.State != tc.want {
				t.Fatalf("after restart: %s, want %s", final.State, tc.want)
			}
			// activated: whether the killed controller's activation happened; either way the deploy is activated
			// once in the end.
			marker, activated, err := deploys.SimulatedTarget{DB: db.DB}.Activation(t.Context(), d.ID)
			if err != nil || !activated || marker.Calls != 1 {
				t.Fatalf("target marker %+v activated=%v err=%v", marker, activated, err)
			}
			if tc.activated {
				if evidence := reconciledEvidence(t, final); evidence["target_marker"] == nil {
					t.Fatalf("evidence %v", evidence)
				}
			} else if n := count(t, db.DB, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = ?`, d.OperationID, deploys.EventRequeued); n != 1 {
				t.Fatalf("%d requeued events; want 1", n)
			}
			var types []string
			for _, ev := range final.History {
				types = append(types, ev.Type)
			}
			if n := finalEvents(t, db.DB, d.OperationID); n != 1 {
				t.Fatalf("%d final events: %v", n, types)
			}
			envNow := environment(t, c, "staging")
			if envNow.Lock != nil || envNow.Version != 1 {
				t.Fatalf("environment: %+v", envNow)
			}
			// The lock is free and the restarted controller runs the next deploy.
			next := decodeDeploy(t, c.Post("/v1/deploys", deployBody("api", "staging", artifact(2)), apitest.Key("k2")).Status(t, 202))
			if s := waitFinal(t, c, next.ID); s.State != deploys.StateSucceeded {
				t.Fatalf("next deploy: %s", s.State)
			}
			// Nothing ran twice: the killed deploy was never activated again, nor activated late.
			if marker, activated, _ := (deploys.SimulatedTarget{DB: db.DB}).Activation(t.Context(), d.ID); !activated || marker.Calls != 1 {
				t.Fatalf("the killed deploy's marker at the end: %+v, activated=%v", marker, activated)
			}
		})
	}
}
