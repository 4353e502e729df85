package agentmcp_test

import (
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/agent/agentmcp"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// refusing fails every request before it leaves while down is set, as a refused connection does.
type refusing struct{ down atomic.Bool }

func (r *refusing) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.down.Load() {
		return nil, errors.New("connection refused")
	}
	return http.DefaultTransport.RoundTrip(req)
}

// retry_action takes a needs_human action out with its key, journaled as asked by the MCP client; it refuses an
// action that is not waiting for a person, and a bad argument is refused before anything is journaled.
func TestRetryActionOverMCP(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, svc)
	net := &refusing{}
	net.down.Store(true)
	journal := filepath.Join(t.TempDir(), "mcp.journal")
	a, err := agent.Open(journal, agent.Config{TicketsURL: env.URL, APIKey: servicetest.AgentSecret, Budget: 1,
		HTTPClient: &http.Client{Transport: net}, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	st, ct := mcp.NewInMemoryTransports()
	ss, err := agentmcp.NewServer(a, "test").Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "retry-test-client"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })

	// A bad argument: refused naming it, nothing journaled; the action id stays free.
	res, _ := callTool(t, cs, "create_ticket", map[string]any{"action_id": "r", "project": "ops", "title": "t", "priority": "asap"})
	sc, _ := res.StructuredContent.(map[string]any)
	if !res.IsError || sc["code"] != "bad_arguments" || !strings.Contains(textOf(res), `argument "priority"`) || sc["arguments"] == nil {
		t.Fatalf("a bad priority: %s %v", textOf(res), sc)
	}
	if _, ok := a.Operation("r"); ok {
		t.Fatal("a refused argument was journaled")
	}

	args := map[string]any{"action_id": "r", "project": "ops", "title": "retried over mcp"}
	if _, r := callTool(t, cs, "create_ticket", args); r.State != agent.StateNeedsHuman {
		t.Fatalf("create with the service unreachable: %+v; want needs_human, the budget of 1 spent", r)
	}
	res, _ = callTool(t, cs, "retry_action", map[string]any{"action_id": "r"})
	if !res.IsError || !strings.Contains(textOf(res), "reason") {
		t.Errorf("retry_action without a reason: %s", textOf(res))
	}
	net.down.Store(false)
	res, r := callTool(t, cs, "retry_action", map[string]any{"action_id": "r", "reason": "the network is back", "budget": 2})
	if res.IsError || r.State != agent.StateSucceeded || r.Attempts != 2 {
		t.Fatalf("retry_action: %s", textOf(res))
	}
	var n int
	env.DB.Raw(`SELECT count(*) FROM tickets WHERE title = 'retried over mcp'`).Scan(&n)
	if n != 1 {
		t.Errorf("%d tickets; want 1", n)
	}
	op, _ := a.Operation("r")
	asked := false
	for _, o := range op.Observations {
		asked = asked || o.Kind == agent.ObsRetryRequested && o.DecidedBy == "mcp:retry-test-client" && strings.Contains(o.Detail, "the network is back")
	}
	if !asked {
		t.Errorf("the journal does not say the client asked: %+v", op.Observations)
	}
	res, _ = callTool(t, cs, "retry_action", map[string]any{"action_id": "r", "reason": "again"})
	if sc, _ := res.StructuredContent.(map[string]any); !res.IsError || sc["code"] != "not_retryable" {
		t.Errorf("retry_action of a succeeded action: %s", textOf(res))
	}
}
