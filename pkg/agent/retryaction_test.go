package agent_test

import (
	"errors"
	"net"
	"net/http"
	"strings"
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

// A budget spent without a single attempt leaving the machine (the service was unreachable) says the way out the
// docs give: a person's retry of the same action, with the same key; never a new action id, which would be a
// second key for one intent. That retry then makes the one ticket.
func TestNeverSentBudgetPointsToRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	open := func(url string) *agent.Agent {
		a, err := agent.Open(b.journal, agent.Config{TicketsURL: url, APIKey: servicetest.AgentSecret, Budget: 2,
			BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := open(closed)
	res, err := a.Do(t.Context(), "down", "create_ticket", ticketArgs("never sent"), agent.DoOptions{})
	a.Close()
	if err != nil || res.State != agent.StateNeedsHuman {
		t.Fatalf("Do = %+v, %v; want needs_human with the budget spent", res, err)
	}
	if !strings.Contains(res.NextStep, "retrysafe agent retry") || !strings.Contains(res.NextStep, "same key") ||
		strings.Contains(res.NextStep, "again under a new action") {
		t.Errorf("next step %q; want agent retry on the same key, not a new action id", res.NextStep)
	}
	a = open(b.env.URL)
	defer a.Close()
	got, err := a.Retry(t.Context(), "down", agent.RetryRequest{By: "os:alice", Reason: "the service is back"})
	if err != nil || got.State != agent.StateSucceeded || got.IdempotencyKey != res.IdempotencyKey {
		t.Fatalf("Retry = %+v, %v; want succeeded with the same key", got, err)
	}
	if n := b.tickets(t, "never sent"); n != 1 {
		t.Errorf("%d tickets; want 1", n)
	}
}
