package agentmcp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/agent/agentmcp"
)

// A write the service holds as unknown is a result with state unknown and its next step, not in_progress and
// not a tool error: the model is told to call again with the same action_id.
func TestServerSideUnknownOverMCP(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			w.Write([]byte(`{"id":"op_u","state":"unknown"}`))
			return
		}
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte(`{"operation_id":"op_u","state":"unknown"}`))
	}))
	t.Cleanup(srv.Close)
	a, err := agent.Open(filepath.Join(t.TempDir(), "mcp.journal"), agent.Config{TicketsURL: srv.URL, APIKey: "k",
		MaxWait: 200 * time.Millisecond, Warn: func(string) {}})
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

	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_ticket",
		Arguments: map[string]any{"action_id": "u", "project": "ops", "title": "unknown"}})
	if err != nil {
		t.Fatal(err)
	}
	var r agent.Result
	raw, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(raw, &r)
	text := res.Content[0].(*mcp.TextContent).Text
	if res.IsError || r.State != agent.StateUnknown || !strings.HasPrefix(text, "state: unknown\nnext step: ") ||
		!strings.Contains(r.NextStep, "same action_id") {
		t.Errorf("result %+v, error %v:\n%s\nwant state unknown with its next step, not an error", r, res.IsError, text)
	}
}
