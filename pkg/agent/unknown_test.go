package agent_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/idem"
)

// scripted is a fake service whose answers to writes and to reads a test changes as it goes; it keeps the
// headers of every write that reached it.
type scripted struct {
	*httptest.Server
	mu          sync.Mutex
	write, read http.HandlerFunc
	writes      []http.Header
}

func newScripted(t *testing.T, write, read http.HandlerFunc) *scripted {
	t.Helper()
	s := &scripted{write: write, read: read}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		h := s.read
		if r.Method != http.MethodGet {
			s.writes = append(s.writes, r.Header.Clone())
			h = s.write
		}
		s.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) answer(write, read http.HandlerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.write, s.read = write, read
}

func (s *scripted) sent() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.writes)
}

func (s *scripted) config() agent.Config {
	return agent.Config{TicketsURL: s.URL, PaymentsURL: s.URL, DeploysURL: s.URL, APIKey: "k",
		BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond, Warn: func(string) {}}
}

func (s *scripted) open(t *testing.T, cfg agent.Config) *agent.Agent {
	t.Helper()
	a, err := agent.Open(filepath.Join(t.TempDir(), "agent.journal"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func answerWith(status int, header map[string]string, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(body))
	}
}

// loseAnswer takes the request and closes the connection without a word: sent, no response.
func loseAnswer(w http.ResponseWriter, r *http.Request) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

// A server-side unknown (a 202 naming the operation unknown, or a 503 outcome_unknown) still unknown when the
// agent stops waiting is its own state, with a next step; not in_progress. Resume keeps driving it, with the
// same key, and settles it once the service knows.
func TestServerSideUnknownIsItsOwnState(t *testing.T) {
	t.Parallel()
	for name, first := range map[string]http.HandlerFunc{
		"202": answerWith(http.StatusAccepted, map[string]string{"Operation-Id": "op_u", "Retry-After": "1"},
			`{"id":"op_u","operation_id":"op_u","state":"unknown"}`),
		"503 outcome_unknown": answerWith(http.StatusServiceUnavailable, map[string]string{"Retry-After": "1"},
			`{"type":"about:blank","status":503,"code":"outcome_unknown","operation_id":"op_u","state":"unknown"}`),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newScripted(t, first, answerWith(http.StatusOK, nil, `{"id":"op_u","state":"unknown"}`))
			cfg := s.config()
			cfg.MaxWait = 200 * time.Millisecond
			path := filepath.Join(t.TempDir(), "agent.journal")
			a, err := agent.Open(path, cfg)
			if err != nil {
				t.Fatal(err)
			}
			res, err := a.Do(t.Context(), "u", "create_ticket", ticketArgs("unknown"), agent.DoOptions{})
			if err != nil || res.State != agent.StateUnknown || res.ServerOperationID != "op_u" ||
				!strings.Contains(res.NextStep, "same action_id") || !strings.Contains(res.NextStep, "op_u") {
				t.Fatalf("Do = %+v, %v; want state unknown naming op_u, with a next step", res, err)
			}
			op, _ := a.Operation("u")
			if op.Final() || op.State() != agent.StateUnknown || len(s.sent()) != 1 {
				t.Fatalf("operation final %v, state %s, %d sends; want unknown, left for resume, one send", op.Final(), op.State(), len(s.sent()))
			}

			a.Close()
			j, err := agent.ReadJournal(path)
			if err != nil {
				t.Fatal(err)
			}
			if jop, _ := j.Operation("u"); j.Result(jop).State != agent.StateUnknown {
				t.Fatalf("the journal, read back, says %s; want unknown", jop.State())
			}

			// The service settles it: resume, waiting past Retry-After, asks, fetches the stored answer with the
			// same key, and settles.
			s.answer(answerWith(http.StatusCreated, map[string]string{"Idempotent-Replayed": "true", "Operation-Id": "op_u"}, `{"id":"tkt_1"}`),
				answerWith(http.StatusOK, nil, `{"id":"op_u","state":"succeeded"}`))
			cfg.MaxWait = time.Minute
			a, err = agent.Open(path, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			results, err := a.Resume(t.Context())
			if err != nil || len(results) != 1 || results[0].State != agent.StateSucceeded {
				t.Fatalf("Resume = %+v, %v; want succeeded", results, err)
			}
			sent := s.sent()
			if len(sent) != 2 || sent[1].Get("Idempotency-Key") != sent[0].Get("Idempotency-Key") {
				t.Errorf("%d sends; want 2 with one key", len(sent))
			}
		})
	}
}

// An operation the service still holds unknown when the attempt budget is spent is unknown, not needs_human:
// the service is reconciling it, and resume goes on asking.
func TestUnknownWithTheBudgetSpentStaysUnknown(t *testing.T) {
	t.Parallel()
	s := newScripted(t, answerWith(http.StatusAccepted, map[string]string{"Operation-Id": "op_u"}, `{"operation_id":"op_u","state":"unknown"}`),
		answerWith(http.StatusOK, nil, `{"id":"op_u","state":"unknown"}`))
	cfg := s.config()
	cfg.Budget = 2
	a := s.open(t, cfg)
	res, err := a.Do(t.Context(), "u", "create_ticket", ticketArgs("unknown"), agent.DoOptions{})
	if err != nil || res.State != agent.StateUnknown || res.Attempts != 2 || len(s.sent()) != 2 {
		t.Fatalf("Do = %+v, %v (%d sends); want unknown after the 2 attempts of the budget", res, err, len(s.sent()))
	}
}

// A 409 request_in_progress is retried with its own reason in the journal; on the wire it carries the nearest
// reason the services list, and the journal says which one was sent.
func TestRequestInProgressHasItsOwnRetryReason(t *testing.T) {
	t.Parallel()
	s := newScripted(t, sequence(
		answerWith(http.StatusConflict, map[string]string{"Retry-After": "0"},
			`{"type":"about:blank","status":409,"code":"request_in_progress","operation_id":"op_p","state":"running"}`),
		answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_p"}, `{"id":"tkt_1"}`)), nil)
	a := s.open(t, s.config())
	res, err := a.Do(t.Context(), "p", "create_ticket", ticketArgs("busy"), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("Do = %+v, %v; want succeeded", res, err)
	}
	op, _ := a.Operation("p")
	second := op.Attempts[1]
	if second.RetryReason != agent.ReasonRequestInProgress {
		t.Errorf("journaled retry reason %q; want %q", second.RetryReason, agent.ReasonRequestInProgress)
	}
	sent := s.sent()[1].Get("Retry-Reason")
	if !slices.Contains(idem.RetryReasons, sent) || (second.RetryReasonSent != "" && second.RetryReasonSent != sent) {
		t.Errorf("Retry-Reason sent %q, journaled as sent %q; want one the services list, journaled", sent, second.RetryReasonSent)
	}
}

// A key past the key_expires_at the service published is never sent again: a resume after a long outage that
// finds the operation succeeded settles from the lookup; one that finds it unknown, or not at all, stops with
// needs_human. A key that still lives is sent again as before.
func TestKeyPastItsExpiryIsNeverSentAgain(t *testing.T) {
	t.Parallel()
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	future := time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339)
	lookup := func(state, expires string) http.HandlerFunc {
		return answerWith(http.StatusOK, nil, `{"items":[{"id":"op_e","state":"`+state+`","key_expires_at":"`+expires+`"}]}`)
	}
	created := answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_e"}, `{"id":"tkt_1"}`)
	// The service published the key's expiry in its first answer, then forgot the key.
	inProgressExpiring := answerWith(http.StatusConflict, map[string]string{"Retry-After": "0"},
		`{"code":"request_in_progress","operation_id":"op_e","state":"running","key_expires_at":"`+past+`"}`)
	for _, c := range []struct {
		name   string
		writes []http.HandlerFunc
		read   http.HandlerFunc
		state  string
		sends  int
		next   string
	}{
		{"expired, succeeded", []http.HandlerFunc{loseAnswer, created}, lookup("succeeded", past), agent.StateSucceeded, 1, "GET /v1/operations/op_e"},
		{"expired, unknown", []http.HandlerFunc{loseAnswer, created}, lookup("unknown", past), agent.StateNeedsHuman, 1, "never sends a key past it"},
		{"expired, failed", []http.HandlerFunc{loseAnswer, created}, lookup("failed", past), agent.StateFailed, 1, "new action_id"},
		{"expired, forgotten", []http.HandlerFunc{inProgressExpiring, created}, answerWith(http.StatusNotFound, nil, `{"code":"not_found"}`),
			agent.StateNeedsHuman, 1, "has no operation"},
		{"alive", []http.HandlerFunc{loseAnswer, created}, lookup("succeeded", future), agent.StateSucceeded, 2, "done"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newScripted(t, sequence(c.writes...), c.read)
			a := s.open(t, s.config())
			res, err := a.Do(t.Context(), "e", "create_ticket", ticketArgs("expiring"), agent.DoOptions{})
			if err != nil || res.State != c.state || !strings.Contains(res.NextStep, c.next) {
				t.Fatalf("Do = %+v, %v; want %s, a next step saying %q", res, err, c.state, c.next)
			}
			if n := len(s.sent()); n != c.sends {
				t.Errorf("%d sends; want %d", n, c.sends)
			}
		})
	}
}

// sequence answers the nth request with the nth handler, and every later one with the last.
func sequence(hs ...http.HandlerFunc) http.HandlerFunc {
	var mu sync.Mutex
	n := 0
	return func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		h := hs[min(n, len(hs)-1)]
		n++
		mu.Unlock()
		h(w, r)
	}
}

// A 409 idempotency_response_expired (the service kept the key, not its stored answer) is how the operation
// ended, read from the answer: never a refusal, never a new key.
func TestResponseExpiredSettlesFromTheAnswer(t *testing.T) {
	t.Parallel()
	s := newScripted(t, answerWith(http.StatusConflict, nil, `{"type":"about:blank","status":409,"code":"idempotency_response_expired",`+
		`"operation_id":"op_r","state":"succeeded","resource":{"type":"ticket","id":"tkt_1","url":"/v1/tickets/tkt_1"}}`), nil)
	a := s.open(t, s.config())
	res, err := a.Do(t.Context(), "r", "create_ticket", ticketArgs("pruned"), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded || res.ServerOperationID != "op_r" || len(s.sent()) != 1 {
		t.Fatalf("Do = %+v, %v (%d sends); want succeeded from the one answer", res, err, len(s.sent()))
	}
	var body struct {
		Resource struct{ ID string } `json:"resource"`
	}
	if json.Unmarshal(res.Body, &body); body.Resource.ID != "tkt_1" {
		t.Errorf("result body %s; want the answer naming the resource", res.Body)
	}
}
