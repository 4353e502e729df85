package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// The planner's `agent do --worker-journal` journals the action and sends nothing; a worker process, `agent do
// --parent-operation`, is SIGKILLed after its request left; the planner's `agent resume` finds the worker's
// journal, reads its unfinished attempt (the answer came, the worker died before journaling it) and reconciles from the service under the one key, sending nothing.
// One ticket; the worker's resume does not send again either (the parent owns retries).
func TestAgentDelegatedWorkerKilled(t *testing.T) {
	t.Parallel()
	w := startAgentWorld(t)
	dir := t.TempDir()
	parent, worker := filepath.Join(dir, "planner.journal"), filepath.Join(dir, "worker.journal")
	const action, args = "alert-11-ticket", `{"project":"ops","title":"Delegated: rotate the key"}`

	handed := w.runAgent(t, nil, "agent", "do", "--journal", parent, "--action", action, "--worker-journal", worker, "create_ticket", args)
	res := handed.result(t)
	if handed.code != exitNeedsHuman || res.State != agent.StateOpen || res.Attempts != 0 || !strings.Contains(res.NextStep, "--parent-operation "+res.OperationID) {
		t.Fatalf("delegate: exit %d %+v; want open, nothing sent, the worker's flags in the next step", handed.code, res)
	}
	w.killAgent(t, "after_answer", 0, "agent", "do", "--journal", worker, "--action", action, "--parent-operation", res.OperationID,
		"create_ticket", args)

	again := w.runAgent(t, nil, "agent", "resume", "--journal", worker)
	if r := again.result(t); again.code != exitNeedsHuman || r.Code != agent.CodeParentOwnsRetries || r.Attempts != 1 {
		t.Fatalf("worker resume: exit %d %+v; want needs_human %s after its one attempt", again.code, r, agent.CodeParentOwnsRetries)
	}
	resumed := w.runAgent(t, nil, "agent", "resume", "--journal", parent)
	if r := resumed.result(t); resumed.code != 0 || r.State != agent.StateSucceeded || r.Attempts != 0 {
		t.Fatalf("planner resume: exit %d %+v\n%s; want succeeded with no attempt of its own", resumed.code, r, resumed.stderr)
	}
	if n := ticketCount(t, w, "Delegated: rotate the key"); n != 1 {
		t.Fatalf("%d tickets; want 1", n)
	}
	show := w.runAgent(t, nil, "agent", "show", "--journal", parent, action)
	if !strings.Contains(show.stdout, "worker      "+worker) || !strings.Contains(show.stdout, "worker_state") {
		t.Errorf("planner show:\n%s", show.stdout)
	}
	verify := w.runAgent(t, nil, "audit", "verify", "--journal", worker)
	if verify.code != 0 {
		t.Errorf("audit verify --journal worker: exit %d\n%s%s", verify.code, verify.stdout, verify.stderr)
	}
}
