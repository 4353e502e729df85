package agent_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// JSON nested deeper than jsondepth.Max is refused where the agent reads it, naming the limit: a tool's
// arguments before anything is journaled or sent, and a tools file when it is read.
func TestDeepJSONIsRefusedByTheAgent(t *testing.T) {
	t.Parallel()
	f := newFakeService(t, answerJSON(http.StatusCreated, `{"id":"tkt_1","operation_id":"op_1"}`))
	a := f.open(t, filepath.Join(t.TempDir(), "deep.journal"), f.config("k"))
	for _, depth := range []int{65, 100_000} {
		deep := json.RawMessage(`{"project":"ops","title":"t","x":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
		_, err := a.Do(t.Context(), "deep", "create_ticket", deep, agent.DoOptions{})
		if !errors.Is(err, agent.ErrBadArguments) || !strings.Contains(err.Error(), "deeper than 64 levels") {
			t.Errorf("arguments %d levels deep: %v; want ErrBadArguments naming the limit", depth, err)
		}
	}
	if _, ok := a.Operation("deep"); ok || f.requests.Load() != 0 {
		t.Errorf("journaled %v, %d requests; want neither", ok, f.requests.Load())
	}

	schema := func(levels int) string {
		return strings.Repeat("{type: object, properties: {a: ", levels) + "{type: string}" + strings.Repeat("}}", levels)
	}
	file := func(levels int) []byte {
		return []byte("services:\n  s: {base_url: 'http://127.0.0.1:1'}\ntools:\n  - {name: t, summary: S., service: s, method: POST, path: /v1/x, " +
			"retry_mode: create, input_schema: " + schema(levels) + "}\n")
	}
	if _, err := agent.ParseTools(file(29)); err != nil { // tools, the tool, 29 schemas of two levels, a leaf: 62
		t.Errorf("a schema within the limit: %v", err)
	}
	if _, err := agent.ParseTools(file(40)); !errors.Is(err, agent.ErrToolsFile) || !strings.Contains(err.Error(), "deeper than 64 levels") {
		t.Errorf("a schema 80 levels deep: %v; want ErrToolsFile naming the limit", err)
	}
}
