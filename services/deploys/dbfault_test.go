package deploys_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// TestDeploySurvivesShortDatabaseOutage is issue 8's third finding: every connection of the deploys service
// drops and new ones are refused for a moment (a fast database restart, as the service sees it) while a deploy
// runs. Its heartbeats and step writes fail and are retried within the lease; the deploy still succeeds,
// activated once, with one final event.
func TestDeploySurvivesShortDatabaseOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, options{background: true, throughProxy: true, stepDuration: 400 * time.Millisecond})
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(81)), apitest.Key("outage")).Status(t, http.StatusAccepted))
	servicetest.Eventually(t, "the deploy runs", func() bool {
		return count(t, b.db, `SELECT count(*) FROM deploys WHERE id = ? AND state = 'running'`, d.ID) == 1
	})

	p := b.env.Proxy
	p.Refuse(true)
	p.CutAll()
	time.Sleep(500 * time.Millisecond) // the outage: heartbeats (every 10 ms) and a step write fall into it
	if n := count(t, b.db, `SELECT count(*) FROM deploys WHERE id = ? AND state = 'running' AND activation_started_at IS NULL`, d.ID); n != 1 {
		t.Fatalf("the deploy was not running through the outage; the test proves nothing")
	}
	p.Refuse(false)

	final := waitFinal(t, b.agent, d.ID)
	if final.State != deploys.StateSucceeded || final.StepsCompleted != 2 {
		t.Fatalf("deploy after the outage: %s, %d steps; want succeeded, 2", final.State, final.StepsCompleted)
	}
	if n := count(t, b.db, `SELECT coalesce(sum(calls), 0) FROM deploy_target_activations WHERE deploy_id = ?`, d.ID); n != 1 {
		t.Fatalf("target activated %d times; want 1", n)
	}
	if n := finalEvents(t, b.db, d.OperationID); n != 1 {
		t.Fatalf("%d final events; want 1", n)
	}
	if n := count(t, b.db, `SELECT count(*) FROM operations WHERE id = ? AND state = 'succeeded'`, d.OperationID); n != 1 {
		t.Fatalf("operation not succeeded")
	}
}
