package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// A person's decision on a needs_human action is recorded in the journal: the action settles in the state
// decided, show names who decided and on what evidence (escaped), the chain stays intact, and nothing is sent.
// An action that does not wait for a person, and evidence a person would misread, are refused.
func TestResolveRecordsAPersonsDecision(t *testing.T) {
	t.Parallel()
	f := newFakeService(t, answerJSON(http.StatusPreconditionRequired,
		`{"type":"about:blank","status":428,"code":"approval_required","operation_id":"op_1"}`))
	path := filepath.Join(t.TempDir(), "resolve.journal")
	a := f.open(t, path, f.config("k"))
	res, err := a.Do(t.Context(), "cap", "capture_payment", json.RawMessage(`{"intent_id":"pi_1"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateNeedsHuman {
		t.Fatalf("Do = %+v, %v; want needs_human", res, err)
	}
	sent := f.requests.Load()

	if _, err := a.Resolve("cap", agent.Decision{State: "failed", Evidence: "a\u202eb", By: "ops"}); err == nil {
		t.Fatal("bidi evidence was recorded")
	}
	if _, err := a.Resolve("cap", agent.Decision{State: "cancelled", Evidence: "x", By: "ops"}); err == nil {
		t.Fatal("a decision of state cancelled was recorded")
	}
	evidence := "Provider dashboard: no capture.\n\x1b[31m not a colour"
	if _, err := a.Resolve("cap", agent.Decision{State: "failed", Evidence: evidence, By: "ops"}); err == nil {
		t.Fatal("evidence with an escape character was recorded")
	}
	evidence = "Provider dashboard: no capture.\nChecked twice."
	got, err := a.Resolve("cap", agent.Decision{State: agent.StateFailed, Evidence: evidence, RemoteRef: "ch_9", By: "os:alice"})
	if err != nil || got.State != agent.StateFailed || len(got.Evidence) != 1 || got.Evidence[0] != evidence {
		t.Fatalf("Resolve = %+v, %v; want failed with the evidence", got, err)
	}
	if _, err := a.Resolve("cap", agent.Decision{State: agent.StateSucceeded, Evidence: "again", By: "os:alice"}); !errors.Is(err, agent.ErrNotNeedsHuman) ||
		!strings.Contains(err.Error(), "failed") {
		t.Fatalf("second decision: %v; want ErrNotNeedsHuman naming failed", err)
	}
	if f.requests.Load() != sent {
		t.Fatal("a decision sent a request")
	}
	a.Close()

	j, err := agent.ReadJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	op, _ := j.Operation("cap")
	var out bytes.Buffer
	op.WriteTimeline(&out)
	if !strings.Contains(out.String(), "observation operator_decision") || !strings.Contains(out.String(), "by os:alice: failed") ||
		!strings.Contains(out.String(), "remote ref ch_9") || !strings.Contains(out.String(), `Provider dashboard: no capture.\nChecked twice.`) ||
		!strings.Contains(out.String(), "settled failed: decided by os:alice") {
		t.Fatalf("show:\n%s", out.String())
	}
	rep, err := agent.VerifyJournal(path)
	if err != nil || !rep.Intact() {
		t.Fatalf("verify: %+v, %v", rep, err)
	}
}
