package agentmcp_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/agent/agentmcp"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// The SDK's client over its in-memory transport: a tool call creates one ticket however often it is repeated
// with its action_id; a refusal is a tool error carrying the service's code, and the server keeps serving.
func TestToolsOverInMemoryTransport(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, svc)
	a, err := agent.Open(filepath.Join(t.TempDir(), "mcp.journal"), agent.Config{TicketsURL: env.URL, APIKey: servicetest.AgentSecret})
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
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })

	callTool := func(name string, args map[string]any) (*mcp.CallToolResult, agent.Result) {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var r agent.Result
		raw, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(raw, &r)
		return res, r
	}
	args := map[string]any{"action_id": "one", "project": "ops", "title": "over mcp"}
	_, first := callTool("create_ticket", args)
	_, again := callTool("create_ticket", args)
	if first.State != agent.StateSucceeded || again.OperationID != first.OperationID || again.Attempts != 1 {
		t.Fatalf("first %+v, again %+v; want one operation, one attempt", first, again)
	}
	var n int
	env.DB.Raw(`SELECT count(*) FROM tickets WHERE title = 'over mcp'`).Scan(&n)
	if n != 1 {
		t.Fatalf("%d tickets; want 1", n)
	}
	res, r := callTool("create_ticket", map[string]any{"action_id": "invalid", "project": "ops"})
	text := res.Content[0].(*mcp.TextContent).Text
	if !res.IsError || r.Code != "validation_failed" || !strings.Contains(text, "validation_failed") || !strings.Contains(text, "next step:") {
		t.Errorf("invalid ticket: %s", text)
	}
	if res, _ := callTool("get_operation", map[string]any{"action_id": "one"}); res.IsError {
		t.Errorf("get_operation after a refusal: the server stopped serving")
	}
}
