package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// fault is a transport in front of the real tickets service: it can lose answers after the request reached the
// service, or answer in the service's place without forwarding.
type fault struct {
	next http.RoundTripper
	// loseAnswers: the next n requests reach the service, which acts; their answers are lost.
	loseAnswers atomic.Int32
	// unavailable: the next n writes are answered 503 with Retry-After 1, without reaching the service.
	unavailable atomic.Int32
	writes      atomic.Int32
}

func (f *fault) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		f.writes.Add(1)
		if f.unavailable.Add(-1) >= 0 {
			return &http.Response{StatusCode: http.StatusServiceUnavailable, Request: req,
				Header: http.Header{"Retry-After": {"1"}, "Content-Type": {"application/problem+json"}},
				Body:   io.NopCloser(strings.NewReader(`{"type":"about:blank","title":"Store unavailable","status":503,"code":"store_unavailable"}`))}, nil
		}
	}
	resp, err := f.next.RoundTrip(req)
	if err == nil && req.Method != http.MethodGet && f.loseAnswers.Add(-1) >= 0 {
		resp.Body.Close()
		return nil, io.ErrUnexpectedEOF
	}
	return resp, err
}

type bundle struct {
	env     *servicetest.Env
	fault   *fault
	journal string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, svc)
	return &bundle{env: env, fault: &fault{next: http.DefaultTransport}, journal: filepath.Join(t.TempDir(), "agent.journal")}
}

func (b *bundle) open(t *testing.T) *agent.Agent {
	t.Helper()
	a, err := agent.Open(b.journal, agent.Config{
		TicketsURL: b.env.URL, APIKey: servicetest.AgentSecret, AuthorityRef: "test:demo-agent",
		HTTPClient: &http.Client{Transport: b.fault}, BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func (b *bundle) tickets(t *testing.T, title string) int {
	t.Helper()
	var n int
	if err := b.env.DB.Raw(`SELECT count(*) FROM tickets WHERE title = ?`, title).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func ticketArgs(title string) json.RawMessage {
	raw, _ := json.Marshal(map[string]string{"project": "ops", "title": title})
	return raw
}

// A lost answer: the service created the ticket, the agent saw a broken connection. It looks the operation up
// (found, with the attempt it saw) and retries with the same key: the service replays; one ticket.
func TestLostAnswerLooksUpAndRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.open(t)
	b.fault.loseAnswers.Store(1)
	res, err := a.Do(t.Context(), "lost", "create_ticket", ticketArgs("lost answer"), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded || res.HTTPStatus != http.StatusCreated {
		t.Fatalf("Do = %+v, %v; want succeeded 201", res, err)
	}
	if n := b.tickets(t, "lost answer"); n != 1 {
		t.Fatalf("%d tickets; want 1", n)
	}
	op, _ := a.Operation("lost")
	if len(op.Attempts) != 2 {
		t.Fatalf("%d attempts; want 2", len(op.Attempts))
	}
	first, second := op.Attempts[0], op.Attempts[1]
	if first.Finished.DispatchState != agent.SentNoResponse {
		t.Errorf("first attempt %s; want sent_no_response", first.Finished.DispatchState)
	}
	if second.RetryOf != first.AttemptID || second.RetryReason != agent.ReasonResponseLostAfterDispatch ||
		second.RetryOfSent != first.AttemptID || second.BudgetLeft != 3 {
		t.Errorf("second attempt lineage %+v; want a retry of %s, response_lost_after_dispatch, sent, budget 3", second, first.AttemptID)
	}
	if len(op.Observations) != 1 || op.Observations[0].Kind != agent.ObsLookup || op.Observations[0].Found == nil ||
		!*op.Observations[0].Found || op.Observations[0].KnownAttempts[0] != first.AttemptID {
		t.Errorf("observations %+v; want one lookup that found the operation and the first attempt", op.Observations)
	}
	// The service recorded both attempts under one operation, the second naming the first.
	var retries int
	b.env.DB.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ? AND detail->>'retry_of' = ? AND detail->>'attempt_id' = ?`,
		res.ServerOperationID, first.AttemptID, second.AttemptID).Scan(&retries)
	if retries != 1 {
		t.Errorf("the service has %d records of the retry naming its parent; want 1", retries)
	}
}

// A service that answers 503 with Retry-After every time: the agent waits, retries with the same key until
// the budget is spent, then hands the operation to a person with the evidence. Nothing reached the service.
func TestBudgetSpentGoesToAPerson(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.open(t)
	b.fault.unavailable.Store(100)
	res, err := a.Do(t.Context(), "busy", "create_ticket", ticketArgs("never"), agent.DoOptions{})
	if err != nil || res.State != agent.StateNeedsHuman || len(res.Evidence) != 5 || res.Attempts != 5 {
		t.Fatalf("Do = %+v, %v; want needs_human after 5 attempts, with their evidence", res, err)
	}
	op, _ := a.Operation("busy")
	for i, at := range op.Attempts {
		if at.Finished.Status != 503 || at.Finished.RetryAfterSeconds != 1 || at.BudgetLeft != 4-i {
			t.Errorf("attempt %d: %+v %+v", i+1, at, at.Finished)
		}
		if i > 0 && (at.RetryReason != agent.ReasonDestination5xx || at.RetryOf != op.Attempts[i-1].AttemptID) {
			t.Errorf("attempt %d: reason %s retry of %s", i+1, at.RetryReason, at.RetryOf)
		}
	}
	if b.fault.writes.Load() != 5 || b.tickets(t, "never") != 0 {
		t.Errorf("%d sends, %d tickets; want 5 and 0", b.fault.writes.Load(), b.tickets(t, "never"))
	}
	// Calling again does not spend a new budget: the person decides.
	again, err := a.Do(t.Context(), "busy", "create_ticket", ticketArgs("never"), agent.DoOptions{})
	if err != nil || again.State != agent.StateNeedsHuman || b.fault.writes.Load() != 5 {
		t.Errorf("Do again = %+v, %v (%d sends); want the same needs_human, nothing sent", again, err, b.fault.writes.Load())
	}
}

// A refusal (4xx) is final: one attempt, never retried. (The input schema lets an empty title through; the
// service does not.)
func TestRefusalIsNeverRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.open(t)
	res, err := a.Do(t.Context(), "bad", "create_ticket", json.RawMessage(`{"project":"ops","title":""}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateRefused || res.Code != "validation_failed" || res.Attempts != 1 {
		t.Fatalf("Do = %+v, %v; want refused validation_failed after 1 attempt", res, err)
	}
}

// The same action with other arguments is refused before anything is sent.
func TestChangedIntentIsRefusedWithoutSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.open(t)
	if _, err := a.Do(t.Context(), "t", "create_ticket", ticketArgs("one"), agent.DoOptions{}); err != nil {
		t.Fatal(err)
	}
	sends := b.fault.writes.Load()
	_, err := a.Do(t.Context(), "t", "create_ticket", ticketArgs("two"), agent.DoOptions{})
	if !errors.Is(err, agent.ErrChangedIntent) || b.fault.writes.Load() != sends || b.tickets(t, "two") != 0 {
		t.Fatalf("changed intent: %v, %d more sends; want ErrChangedIntent and nothing sent", err, b.fault.writes.Load()-sends)
	}
}

// The journal never holds the API key, and a restarted agent (a new Open) continues an operation a dead one
// left: resume looks it up and retries with the same key.
func TestResumeAfterAnAttemptWithoutItsEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A first agent sends and "dies" before recording the answer: its hook stops the attempt there.
	stop := errors.New("died")
	a, err := agent.Open(b.journal, agent.Config{TicketsURL: b.env.URL, APIKey: servicetest.AgentSecret,
		Hook: func(p string) {
			if p == "after_answer" {
				panic(stop)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != stop {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = a.Do(context.Background(), "r", "create_ticket", ticketArgs("resumed"), agent.DoOptions{})
	}()
	a.Close()

	a2 := b.open(t)
	results, err := a2.Resume(t.Context())
	if err != nil || len(results) != 1 || results[0].State != agent.StateSucceeded {
		t.Fatalf("Resume = %+v, %v; want one operation succeeded", results, err)
	}
	if n := b.tickets(t, "resumed"); n != 1 {
		t.Fatalf("%d tickets; want 1", n)
	}
	op, _ := a2.Operation("r")
	if op.Observations[0].Kind != agent.ObsInterrupted || op.Observations[1].Kind != agent.ObsLookup {
		t.Errorf("observations %+v; want the interrupted attempt, then a lookup", op.Observations)
	}
	raw, _ := os.ReadFile(b.journal)
	if bytes.Contains(raw, []byte(servicetest.AgentSecret)) {
		t.Error("the journal holds the API key")
	}
}

// A second agent on a journal in use is refused at once (LockWait 0).
func TestJournalLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.open(t)
	if _, err := agent.Open(b.journal, agent.Config{}); !errors.Is(err, agent.ErrJournalLocked) {
		t.Fatalf("second Open = %v; want ErrJournalLocked", err)
	}
}

// VerifyJournal finds a changed record and a removed one; an unfinished last line is no break, and the next
// writer discards it.
func TestVerifyJournal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.open(t)
	if _, err := a.Do(t.Context(), "v", "create_ticket", ticketArgs("verified"), agent.DoOptions{}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if rep, err := agent.VerifyJournal(b.journal); err != nil || !rep.Intact() || rep.Records < 6 {
		t.Fatalf("VerifyJournal = %+v, %v; want intact", rep, err)
	}
	raw, _ := os.ReadFile(b.journal)
	lines := strings.SplitAfter(string(raw), "\n")

	tamper := func(name string, content string, want auditchain.Kind) {
		p := filepath.Join(t.TempDir(), name)
		os.WriteFile(p, []byte(content), 0o600)
		rep, err := agent.VerifyJournal(p)
		if err != nil || rep.Intact() || rep.Problems[0].Kind != want {
			t.Errorf("%s: %+v, %v; want %s", name, rep.Problems, err, want)
		}
	}
	tamper("changed", strings.Replace(string(raw), `"title":"verified"`, `"title":"verifieD"`, 1), auditchain.Changed)
	changed := filepath.Join(t.TempDir(), "changed")
	os.WriteFile(changed, []byte(strings.Replace(string(raw), `"title":"verified"`, `"title":"verifieD"`, 1)), 0o600)
	if _, err := agent.Open(changed, agent.Config{}); !errors.Is(err, agent.ErrJournalBroken) {
		t.Errorf("Open of a changed journal = %v; want ErrJournalBroken", err)
	}
	tamper("removed", strings.Join(append(append([]string{}, lines[:3]...), lines[4:]...), ""), auditchain.Missing)

	os.WriteFile(b.journal, append(raw, []byte(`{"chain":"jnl_x","seq":`)...), 0o600)
	if rep, err := agent.VerifyJournal(b.journal); err != nil || !rep.Intact() || rep.TornBytes == 0 {
		t.Errorf("torn tail: %+v, %v; want intact with the torn bytes counted", rep, err)
	}
	b.open(t).Close()
	if rep, err := agent.VerifyJournal(b.journal); err != nil || !rep.Intact() || rep.TornBytes != 0 {
		t.Errorf("after the next writer: %+v, %v; want intact, torn tail gone", rep, err)
	}
}
