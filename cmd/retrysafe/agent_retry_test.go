package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/pkg/agent"
)

// TestAgentRetryCommand: an action that spent its budget on a service nobody answered for goes again with its key
// once a person asks (agent retry), journaled with who asked; a bad argument is refused before the journal and
// leaves the action id free.
func TestAgentRetryCommand(t *testing.T) {
	t.Parallel()
	w := startAgentWorld(t)
	path := filepath.Join(t.TempDir(), "retry.journal")
	down := map[string]string{"TICKETS_URL": "http://" + proctest.FreeAddr(t), "AGENT_BUDGET": "2"}
	args := `{"project":"retry","title":"after agent retry"}`

	bad := w.runAgent(t, nil, "agent", "do", "--journal", path, "--action", "a", "create_ticket", `{"project":"retry","title":"x","priority":"asap"}`)
	if bad.code != 1 || !strings.Contains(bad.stderr, `argument "priority"`) || bad.stdout != "" {
		t.Fatalf("a bad argument: exit %d %s%s; want 1 naming priority", bad.code, bad.stdout, bad.stderr)
	}
	spent := w.runAgent(t, down, "agent", "do", "--journal", path, "--action", "a", "create_ticket", args)
	first := spent.result(t)
	if spent.code != 3 || first.State != agent.StateNeedsHuman || first.Attempts != 2 {
		t.Fatalf("do with the service down: exit %d %s; want 3 needs_human after 2 attempts", spent.code, spent.stdout)
	}
	if r := w.runAgent(t, nil, "agent", "retry", "--journal", path, "--budget", "500", "a"); r.code != 1 {
		t.Errorf("retry --budget 500: exit %d; want 1", r.code)
	}
	retried := w.runAgent(t, nil, "agent", "retry", "--journal", path, "--by", "ops:alice", "--reason", "tickets is back", "--budget", "3", "a")
	r := retried.result(t)
	if retried.code != 0 || r.State != agent.StateSucceeded || r.IdempotencyKey != first.IdempotencyKey || r.OperationID != first.OperationID {
		t.Fatalf("retry: exit %d %s%s; want 0, succeeded, the same operation and key", retried.code, retried.stdout, retried.stderr)
	}
	if n := ticketCount(t, w, "after agent retry"); n != 1 {
		t.Errorf("%d tickets; want 1", n)
	}
	if again := w.runAgent(t, nil, "agent", "retry", "--journal", path, "a"); again.code != 4 || !strings.Contains(again.stderr, "succeeded") {
		t.Errorf("retry of a succeeded action: exit %d %s; want 4", again.code, again.stderr)
	}
	show := w.runAgent(t, nil, "agent", "show", "--journal", path, "a")
	if !strings.Contains(show.stdout, "observation retry_requested") || !strings.Contains(show.stdout, "ops:alice") ||
		!strings.Contains(show.stdout, "tickets is back") {
		t.Errorf("show does not tell who asked for the retry:\n%s", show.stdout)
	}
}
