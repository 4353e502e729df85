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

// TestAgentResolveCommand: `agent resolve` records a person's decision on a needs_human action in the journal
// (exit 0, the settled result printed), show tells it, audit verify --journal finds the chain intact; a bad
// decision is a usage error (exit 1) that writes nothing, and nothing is ever sent.
func TestAgentResolveCommand(t *testing.T) {
	t.Parallel()
	url, requests := fakeServices(t, `{"type":"about:blank","status":428,"code":"approval_required","operation_id":"op_1"}`,
		http.StatusPreconditionRequired)
	path := filepath.Join(t.TempDir(), "resolve.journal")
	vars := env(map[string]string{"PAYMENTS_URL": url, "AGENT_API_KEY": "key-r", "AGENT_LOCK_WAIT": "0s"})
	var out bytes.Buffer
	err := run(t.Context(), []string{"agent", "do", "--journal", path, "--action", "cap", "capture_payment", `{"intent_id":"pi_1"}`}, vars, &out)
	if exitCode(err) != exitNeedsHuman {
		t.Fatalf("do: exit %d %v %s; want needs_human", exitCode(err), err, out.String())
	}
	sent := requests.Load()

	for _, bad := range [][]string{
		{"--state", "cancelled", "--evidence", "x", "cap"},
		{"--state", "failed", "--evidence", "a\u202eb", "cap"},
		{"--state", "failed", "cap"},
	} {
		out.Reset()
		err := run(t.Context(), append([]string{"agent", "resolve", "--journal", path}, bad...), vars, &out)
		if exitCode(err) != 1 {
			t.Errorf("resolve %q: exit %d; want 1", bad, exitCode(err))
		}
	}
	out.Reset()
	err = run(t.Context(), []string{"agent", "resolve", "--journal", path, "--state", "failed",
		"--evidence", "dashboard: no capture", "--by", "alice", "cap"}, vars, &out)
	var res agent.Result
	if err != nil || json.Unmarshal(out.Bytes(), &res) != nil || res.State != agent.StateFailed {
		t.Fatalf("resolve: %v %s; want the failed result", err, out.String())
	}
	out.Reset()
	if err := run(t.Context(), []string{"agent", "show", "--journal", path, "cap"}, vars, &out); err != nil ||
		!strings.Contains(out.String(), "operator_decision") || !strings.Contains(out.String(), "by alice: failed") {
		t.Fatalf("show: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(t.Context(), []string{"audit", "verify", "--journal", path}, vars, &out); err != nil {
		t.Fatalf("audit verify --journal: %v %s", err, out.String())
	}
	if requests.Load() != sent {
		t.Fatal("resolve sent a request")
	}
}
