package agent_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
)

// A spent budget is a way out, not a dead end: a person asks for a retry, journaled with who asked and why, and
// the action goes again with its key, the first attempt sent as operator_requested. One ticket, one key.
func TestRetryKeepsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	open := func() *agent.Agent {
		a, err := agent.Open(b.journal, agent.Config{TicketsURL: b.env.URL, APIKey: servicetest.AgentSecret, Budget: 2,
			HTTPClient: &http.Client{Transport: b.fault}, BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := open()
	b.fault.unavailable.Store(2)
	res, err := a.Do(t.Context(), "busy", "create_ticket", ticketArgs("after a retry"), agent.DoOptions{})
	if err != nil || res.State != agent.StateNeedsHuman || res.Attempts != 2 {
		t.Fatalf("Do = %+v, %v; want needs_human with the budget of 2 spent", res, err)
	}
	if _, err := a.Retry(t.Context(), "busy", agent.RetryRequest{Reason: "back"}); !errors.Is(err, agent.ErrBadArguments) {
		t.Errorf("a retry that names nobody: %v", err)
	}
	if _, err := a.Retry(t.Context(), "nope", agent.RetryRequest{By: "os:alice"}); !errors.Is(err, agent.ErrUnknownAction) {
		t.Errorf("a retry of an unknown action: %v", err)
	}
	if b.fault.writes.Load() != 2 {
		t.Fatalf("%d sends before the retry; want 2", b.fault.writes.Load())
	}

	got, err := a.Retry(t.Context(), "busy", agent.RetryRequest{By: "os:alice", Reason: "the service is back", Budget: 3})
	if err != nil || got.State != agent.StateSucceeded || got.IdempotencyKey != res.IdempotencyKey || got.OperationID != res.OperationID {
		t.Fatalf("Retry = %+v, %v; want the same operation and key, succeeded", got, err)
	}
	if n := b.tickets(t, "after a retry"); n != 1 || b.fault.writes.Load() != 3 {
		t.Errorf("%d tickets from %d sends; want 1 from 3", n, b.fault.writes.Load())
	}
	if _, err := a.Retry(t.Context(), "busy", agent.RetryRequest{By: "os:alice"}); !errors.Is(err, agent.ErrNotNeedsHuman) {
		t.Errorf("a retry of a succeeded action: %v; want ErrNotNeedsHuman", err)
	}
	a.Close()

	// The journal, read again, tells it: who asked, the budget, and the attempt it led to.
	a = open()
	defer a.Close()
	op, _ := a.Operation("busy")
	var asked *agent.Observation
	for _, o := range op.Observations {
		if o.Kind == agent.ObsRetryRequested {
			asked = o
		}
	}
	if asked == nil || asked.DecidedBy != "os:alice" || asked.Budget != 3 || op.State() != agent.StateSucceeded {
		t.Fatalf("journal: retry %+v, state %s; want asked by os:alice with budget 3, succeeded", asked, op.State())
	}
	last := op.Attempts[len(op.Attempts)-1]
	if len(op.Attempts) != 3 || last.RetryReason != agent.ReasonOperatorRequested || last.BudgetLeft != 2 || last.At < asked.At {
		t.Errorf("attempts %d, the last %+v; want a third, operator_requested, budget left 2, after the request", len(op.Attempts), last)
	}
	if rep, err := agent.VerifyJournal(b.journal); err != nil || !rep.Intact() {
		t.Errorf("journal: %v %+v", err, rep)
	}
}
