package deploys_test

import (
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// TestEnvironmentCatchesUpWithTheTarget: deploy 1 succeeds (version 1, the target's marker says so). A failover
// takes the environment's last commits away (here: the environment row back at version 0, the target untouched).
// A deploy planned against version 1 is not refused 409 environment_version_mismatch: the environment catches up
// with the marker (version 1, deploy 1 current), the deploy runs and makes version 2, and deploy 1 was activated
// once. A deploy expecting a version the target does not know either is still refused.
func TestEnvironmentCatchesUpWithTheTarget(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	first := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1), `"expected_environment_version":0`),
		apitest.Key("k1")).Status(t, 202))
	b.runOnce(t)
	if s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+first.ID).Status(t, 200)); s.State != deploys.StateSucceeded {
		t.Fatalf("first deploy: %s", s.State)
	}
	if err := b.db.Exec(`UPDATE environments SET version = 0, current_deploy_id = NULL, current_artifact = NULL
WHERE name = 'staging'`).Error; err != nil {
		t.Fatal(err)
	}

	r := b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(2), `"expected_environment_version":5`), apitest.Key("k-far"))
	r.Status(t, 409)
	if code := r.Str(t, "code"); code != "environment_version_mismatch" {
		t.Fatalf("a version nobody knows: %s", r.Body)
	}
	second := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(2), `"expected_environment_version":1`),
		apitest.Key("k2")).Status(t, 202))
	b.runOnce(t)
	if s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+second.ID).Status(t, 200)); s.State != deploys.StateSucceeded {
		t.Fatalf("second deploy: %s", s.State)
	}
	env := environment(t, b.agent, "staging")
	if env.Version != 2 {
		t.Fatalf("environment: %+v; want version 2", env)
	}
	if n := count(t, b.db, `SELECT count(*) FROM environments WHERE name = 'staging' AND previous_deploy_id = ? AND current_deploy_id = ?`,
		first.ID, second.ID); n != 1 {
		t.Errorf("the environment does not go from deploy 1 to deploy 2")
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploy_target_activations WHERE calls = 1`); n != 2 {
		t.Errorf("%d deploys activated once; want 2", n)
	}
}
