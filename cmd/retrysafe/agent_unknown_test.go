package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// TestAgentCommandUnknownExitCode: a write the service holds as unknown ends `agent do` with state unknown, a
// next step and exit 6, not 3; resume exits 6 while it stays unknown; show says unknown. --parent-run is
// journaled and shown; AGENT_NAMESPACE decides the key.
func TestAgentCommandUnknownExitCode(t *testing.T) {
	t.Parallel()
	url, _ := fakeServices(t, `{"operation_id":"op_u","state":"unknown"}`, http.StatusAccepted)
	path := filepath.Join(t.TempDir(), "unknown.journal")
	vars := env(map[string]string{"TICKETS_URL": url, "AGENT_API_KEY": "k", "AGENT_MAX_WAIT": "300ms", "AGENT_NAMESPACE": "team-a",
		"AGENT_NAMESPACE_SECRET": "team-a-secret-0123456789"})
	var out bytes.Buffer
	err := run(t.Context(), []string{"agent", "do", "--journal", path, "--action", "u", "--parent-run", "run_planner-1",
		"create_ticket", `{"project":"ops","title":"unknown"}`}, vars, &out)
	var res agent.Result
	if jerr := json.Unmarshal(out.Bytes(), &res); exitCode(err) != exitUnknown || jerr != nil || res.State != agent.StateUnknown ||
		!strings.Contains(res.NextStep, "same action_id") {
		t.Fatalf("do: exit %d (%v), %s; want %d, state unknown with a next step", exitCode(err), err, out.String(), exitUnknown)
	}
	out.Reset()
	if err := run(t.Context(), []string{"agent", "resume", "--journal", path}, vars, &out); exitCode(err) != exitUnknown {
		t.Errorf("resume while unknown: exit %d (%v); want %d", exitCode(err), err, exitUnknown)
	}
	out.Reset()
	if err := run(t.Context(), []string{"agent", "show", "--journal", path, "u"}, vars, &out); err != nil ||
		!strings.Contains(out.String(), "state unknown") || !strings.Contains(out.String(), "parent run  run_planner-1") ||
		!strings.Contains(out.String(), `derived from namespace "team-a" and the action id under the namespace's secret (env:AGENT_NAMESPACE_SECRET)`) {
		t.Errorf("show: %v\n%s", err, out.String())
	}
}
