package deploys_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// TestPrunedDeployKeyNeverRunsTwice: a deploy runs to success and its stored response is pruned (what
// IDEMPOTENCY_RETENTION does, once the clock moved past it); the same request with the same key is 409
// idempotency_response_expired naming the deploy, and nothing runs again: one deploy row, one activation at the
// target, the environment at version 1.
func TestPrunedDeployKeyNeverRunsTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	b.env.Idem.Retention = time.Hour
	body := deployBody("api", "staging", artifact(7))
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", body, apitest.Key("deploy-pruned")).Status(t, http.StatusAccepted))
	b.runOnce(t)
	if final := waitFinal(t, b.agent, d.ID); final.State != deploys.StateSucceeded {
		t.Fatalf("deploy %+v; want succeeded", final.Deploy)
	}
	b.env.Clock.Advance(time.Hour + time.Minute)
	if responses, _, err := b.env.Idem.Prune(t.Context()); err != nil || responses != 1 {
		t.Fatalf("prune: %d responses, %v; want the deploy's", responses, err)
	}

	r := b.agent.Post("/v1/deploys", body, apitest.Key("deploy-pruned")).Status(t, http.StatusConflict)
	doc := r.JSON(t)
	resource, _ := doc["resource"].(map[string]any)
	if doc["code"] != "idempotency_response_expired" || doc["operation_id"] != d.OperationID || doc["state"] != "succeeded" ||
		resource["type"] != "deploy" || resource["id"] != d.ID {
		t.Fatalf("retry after the prune: %s; want 409 idempotency_response_expired naming deploy %s", r.Body, d.ID)
	}
	if ran, err := b.ctrl.RunOnce(t.Context()); err != nil || ran {
		t.Errorf("controller after the retry: ran=%v err=%v; want nothing queued", ran, err)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys`); n != 1 {
		t.Errorf("%d deploys; want 1", n)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploy_target_activations`); n != 1 {
		t.Errorf("%d activations at the target; want 1", n)
	}
	if env := environment(t, b.agent, "staging"); env.Version != 1 {
		t.Errorf("environment version %d; want 1", env.Version)
	}
	op := b.agent.Get("/v1/operations/"+d.OperationID).Status(t, http.StatusOK).JSON(t)
	if op["key_expires_at"] == nil || op["response_expires_at"] == nil {
		t.Errorf("operation %v; want response_expires_at and key_expires_at", op)
	}
}
