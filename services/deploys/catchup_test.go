package deploys_test

import (
	"testing"

	"gorm.io/gorm"

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

// TestLostDeployIsAdopted: deploy 1 succeeds, then a failover takes it from our database (its operation, its row,
// the environment back at version 0; the target keeps its marker). A client that saw it succeed plans deploy 2 on
// version 1: the environment catches up with the marker and deploy 2 runs. Deploy 1's request sent again under its
// key is answered with deploy 1's id, succeeded, from the target's marker: it does not run again, the target
// activated it once, and the environment stays at deploy 2.
func TestLostDeployIsAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	body1 := deployBody("api", "staging", artifact(1), `"expected_environment_version":0`)
	first := decodeDeploy(t, b.agent.Post("/v1/deploys", body1, apitest.Key("k1")).Status(t, 202))
	b.runOnce(t)
	var opID string
	if err := b.db.Raw(`SELECT operation_id FROM deploys WHERE id = ?`, first.ID).Scan(&opID).Error; err != nil {
		t.Fatal(err)
	}
	b.env.DB.Tampered() // the audit records of the lost operation go with it
	err := b.env.DB.Connection(func(conn *gorm.DB) error {
		if err := conn.Exec(`SET session_replication_role = replica`).Error; err != nil {
			return err
		}
		defer conn.Exec(`SET session_replication_role = origin`)
		for q, arg := range map[string]string{
			`DELETE FROM operation_events WHERE operation_id = ?`: opID, `DELETE FROM operations WHERE id = ?`: opID,
			`DELETE FROM deploys WHERE id = ?`: first.ID, `DELETE FROM environment_locks WHERE environment = ?`: "staging",
			`UPDATE environments SET version = 0, current_deploy_id = NULL, current_artifact = NULL WHERE name = ?`: "staging",
		} {
			if err := conn.Exec(q, arg).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	second := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(2), `"expected_environment_version":1`),
		apitest.Key("k2")).Status(t, 202))
	b.runOnce(t)
	again := decodeDeploy(t, b.agent.Post("/v1/deploys", body1, apitest.Key("k1")).Status(t, 202))
	if again.ID != first.ID || again.State != deploys.StateSucceeded {
		t.Fatalf("deploy 1 sent again: %s %s; want %s succeeded", again.ID, again.State, first.ID)
	}
	if s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+second.ID).Status(t, 200)); s.State != deploys.StateSucceeded {
		t.Fatalf("second deploy: %s", s.State)
	}
	if env := environment(t, b.agent, "staging"); env.Version != 2 {
		t.Errorf("environment: %+v; want version 2, deploy 2", env)
	}
	if n := count(t, b.db, `SELECT count(*) FROM environments WHERE name = 'staging' AND current_deploy_id = ?`, second.ID); n != 1 {
		t.Errorf("the environment's current deploy is not deploy 2")
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploy_target_activations WHERE calls = 1`); n != 2 {
		t.Errorf("%d deploys activated once; want 2 (deploy 1 not called again)", n)
	}
	if n := count(t, b.db, `SELECT count(*) FROM operations WHERE idempotency_key = 'k1' AND state = 'succeeded'`); n != 1 {
		t.Errorf("deploy 1's operation sent again: %d succeeded; want 1", n)
	}
}
