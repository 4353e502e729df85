package deploys_test

import (
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// unknownDeploy queues a deploy whose worker claims it and stalls until its lease has run out, and marks its
// operation unknown as the recovery worker does.
func unknownDeploy(t *testing.T, b *bundle, key string, n int) deploys.Status {
	t.Helper()
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(n)), apitest.Key(key)).Status(t, http.StatusAccepted))
	claimExpired(t, b)
	if _, err := (&opstatus.RecoveryWorker{DB: database.SQL(b.db)}).RunOnce(t.Context()); err != nil { // expires the lease; no reconciler
		t.Fatal(err)
	}
	return d
}

// A person's decision on an unknown deploy releases the environment's lock: failed leaves the environment as
// it was, succeeded moves it to the deploy.
func TestPersonDecidesUnknownDeploy(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	first := unknownDeploy(t, b, "dep-1", 1)
	if env := environment(t, b.agent, "staging"); env.Lock == nil || env.Lock.HolderDeployID != first.ID {
		t.Fatalf("lock before the decision: %+v; want held by %s", env.Lock, first.ID)
	}
	var op opstatus.Operation
	b.approver.Post("/v1/operations/"+first.OperationID+"/resolution",
		`{"state":"failed","evidence":"target logs: activation never started"}`, apitest.Key("d-1")).
		Status(t, http.StatusOK).Decode(t, &op)
	if op.State != opstatus.StateFailed {
		t.Fatalf("operation %s; want failed", op.State)
	}
	env := environment(t, b.agent, "staging")
	if s := decodeDeploy(t, b.agent.Get("/v1/deploys/"+first.ID).Status(t, http.StatusOK)); s.State != deploys.StateFailed || env.Lock != nil || env.CurrentDeployID != nil {
		t.Fatalf("after failed: deploy %s, lock %+v, current %v; want failed, no lock, nothing deployed", s.State, env.Lock, env.CurrentDeployID)
	}

	// The lock is free, so the next deploy queues; decided succeeded, it is what the environment runs.
	second := unknownDeploy(t, b, "dep-2", 2)
	b.approver.Post("/v1/operations/"+second.OperationID+"/resolution",
		`{"state":"succeeded","evidence":"target shows the new version serving","remote_ref":"release-42"}`, apitest.Key("d-2")).
		Status(t, http.StatusOK)
	env = environment(t, b.agent, "staging")
	if env.Lock != nil || env.CurrentDeployID == nil || *env.CurrentDeployID != second.ID {
		t.Fatalf("after succeeded: lock %+v, current %v; want no lock, %s", env.Lock, env.CurrentDeployID, second.ID)
	}
	if n := finalEvents(t, b.db, second.OperationID); n != 1 {
		t.Fatalf("%d final events on the decided operation; want 1", n)
	}
	servicetest.AuditIntact(t, b.db)
}
