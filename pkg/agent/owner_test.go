package agent_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// Two journals given one action at once (two agents, or a worker handed the action while its planner still
// holds it) send one idempotency key, derived from the namespace and the action id: the real tickets service
// runs it once. Neither journal knows of the other; the service dedupes what they cannot.
func TestTwoJournalsOneActionOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	open := func(name string) *agent.Agent {
		a, err := agent.Open(filepath.Join(t.TempDir(), name), agent.Config{TicketsURL: b.env.URL, APIKey: servicetest.AgentSecret,
			BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	agents := []*agent.Agent{open("planner.journal"), open("worker.journal")}
	results := make([]agent.Result, len(agents))
	errs := make([]error, len(agents))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Go(func() {
			<-start
			results[i], errs[i] = a.Do(t.Context(), "alert-42-ticket", "create_ticket", ticketArgs("one owner"), agent.DoOptions{})
		})
	}
	close(start)
	wg.Wait()
	for i, r := range results {
		if errs[i] != nil || r.State != agent.StateSucceeded {
			t.Fatalf("agent %d: %+v, %v; want succeeded", i, r, errs[i])
		}
	}
	if results[0].IdempotencyKey != results[1].IdempotencyKey || results[0].ServerOperationID != results[1].ServerOperationID {
		t.Errorf("keys %s and %s, operations %s and %s; want one of each", results[0].IdempotencyKey, results[1].IdempotencyKey,
			results[0].ServerOperationID, results[1].ServerOperationID)
	}
	if n := b.tickets(t, "one owner"); n != 1 {
		t.Fatalf("%d tickets; want 1", n)
	}
	var ops int
	b.env.DB.Raw(`SELECT count(*) FROM operations WHERE idempotency_key = ?`, results[0].IdempotencyKey).Scan(&ops)
	if ops != 1 {
		t.Errorf("%d operations under the key; want 1", ops)
	}
	op, _ := agents[0].Operation("alert-42-ticket")
	if op.Principal == nil || op.KeyNamespace != op.Principal.KeyID {
		t.Errorf("namespace %q; want the key id by default (%+v)", op.KeyNamespace, op.Principal)
	}
}

// The key is a function of the namespace, its secret and the action id: agents holding different keys of one
// account converge when told one namespace and its secret; by default (the key id, under the API key) they do
// not; another namespace, or another secret, is another key. Knowing the namespace and the action id is not
// enough to compute it. A namespace without its secret, a short secret, or a namespace that is empty-but-set,
// too long or not printable ASCII is refused at Open.
func TestNamespaceDecidesTheKey(t *testing.T) {
	t.Parallel()
	s := newScripted(t, answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_1"}, `{"id":"tkt_1"}`), nil)
	const secretA, secretB = "team-a-secret-0123456789", "team-b-secret-0123456789"
	keyOf := func(apiKey, namespace, secret string) string {
		cfg := s.config()
		cfg.APIKey, cfg.Namespace, cfg.NamespaceSecret = apiKey, namespace, secret
		res, err := s.open(t, cfg).Do(t.Context(), "act", "create_ticket", ticketArgs("ns"), agent.DoOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res.IdempotencyKey
	}
	shared := keyOf("key-one", "team-a", secretA)
	if keyOf("key-two", "team-a", secretA) != shared {
		t.Error("two keys in one namespace made two idempotency keys for one action")
	}
	if keyOf("key-one", "team-a", secretB) == shared {
		t.Error("two secrets of one namespace made one idempotency key")
	}
	if keyOf("key-one", "", "") == keyOf("key-two", "", "") {
		t.Error("the default namespaces of two keys made one idempotency key")
	}
	if keyOf("key-one", "team-b", secretA) == shared {
		t.Error("two namespaces made one idempotency key")
	}
	// What anyone who knows the namespace and the action id could compute.
	sum := sha256.Sum256(fmt.Appendf(nil, "retrysafe agent idempotency key\n%d:%s%d:%s", len("team-a"), "team-a", len("act"), "act"))
	if shared == "idk_"+hex.EncodeToString(sum[:16]) {
		t.Error("the key is a hash of the namespace and the action id alone: anyone can compute it")
	}
	for _, c := range []struct{ ns, secret string }{{strings.Repeat("n", 201), secretA}, {"team\na", secretA}, {"tëam", secretA},
		{"team-a", ""}, {"team-a", "short"}} {
		cfg := s.config()
		cfg.Namespace, cfg.NamespaceSecret = c.ns, c.secret
		if a, err := agent.Open(filepath.Join(t.TempDir(), "ns.journal"), cfg); err == nil {
			a.Close()
			t.Errorf("namespace %q with secret %q accepted", c.ns, c.secret)
		}
	}
}

// A delegated action's journal names the run that handed it over; a parent run that is not a run id is
// refused before anything is journaled.
func TestParentRunIsJournaled(t *testing.T) {
	t.Parallel()
	s := newScripted(t, answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_1"}, `{"id":"tkt_1"}`), nil)
	path := filepath.Join(t.TempDir(), "worker.journal")
	a, err := agent.Open(path, s.config())
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"run 1", strings.Repeat("r", 129), "run\x1b"} {
		if _, err := a.Do(t.Context(), "bad", "create_ticket", ticketArgs("p"), agent.DoOptions{ParentRun: bad}); !errors.Is(err, agent.ErrBadArguments) {
			t.Errorf("parent run %q: %v; want ErrBadArguments", bad, err)
		}
	}
	if _, ok := a.Operation("bad"); ok || len(s.sent()) != 0 {
		t.Fatalf("a refused parent run journaled the action or sent %d requests", len(s.sent()))
	}
	if _, err := a.Do(t.Context(), "child", "create_ticket", ticketArgs("p"), agent.DoOptions{ParentRun: "run_planner-7"}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	j, err := agent.ReadJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	op, _ := j.Operation("child")
	var show strings.Builder
	op.WriteTimeline(&show)
	if op.ParentRunID != "run_planner-7" || !strings.Contains(show.String(), "parent run  run_planner-7") {
		t.Errorf("parent run %q, show:\n%s", op.ParentRunID, show.String())
	}
}

// A new action superseding one whose outcome is unknown is not sent: a replacement could add to an effect that
// may have happened. It stops needs_human, saying so; once the old one settled, the same call sends it, naming
// the old operation. With a person's approval it goes at once.
func TestSupersedingAnUnknownOperationWaits(t *testing.T) {
	t.Parallel()
	unknown := answerWith(http.StatusAccepted, map[string]string{"Operation-Id": "op_old", "Retry-After": "1"},
		`{"operation_id":"op_old","state":"unknown"}`)
	s := newScripted(t, unknown, answerWith(http.StatusOK, nil, `{"id":"op_old","state":"unknown"}`))
	path := filepath.Join(t.TempDir(), "agent.journal")
	cfg := s.config()
	cfg.MaxWait = 200 * time.Millisecond
	a, err := agent.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res, _ := a.Do(t.Context(), "old", "create_ticket", ticketArgs("old"), agent.DoOptions{}); res.State != agent.StateUnknown {
		t.Fatalf("old action %+v; want unknown", res)
	}
	res, err := a.Do(t.Context(), "new", "create_ticket", ticketArgs("new"), agent.DoOptions{Supersedes: "old"})
	if err != nil || res.State != agent.StateNeedsHuman || res.Code != agent.CodeSupersededUnknown ||
		!strings.Contains(res.NextStep, `"old"`) || len(s.sent()) != 1 {
		t.Fatalf("superseding an unknown operation: %+v, %v, %d sends; want needs_human %s naming the old action, nothing sent",
			res, err, len(s.sent()), agent.CodeSupersededUnknown)
	}
	if again, _ := a.Do(t.Context(), "new", "create_ticket", ticketArgs("new"), agent.DoOptions{Supersedes: "old"}); again.State != agent.StateNeedsHuman ||
		len(s.sent()) != 1 {
		t.Fatalf("called again while the old one is unknown: %+v, %d sends; want the same, nothing sent", again, len(s.sent()))
	}
	a.Close()

	// The service settles the old operation: the old action reads it; the new one is then sent.
	s.answer(answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_old", "Idempotent-Replayed": "true"}, `{"id":"tkt_1"}`),
		answerWith(http.StatusOK, nil, `{"id":"op_old","state":"succeeded"}`))
	cfg.MaxWait = time.Minute
	a, err = agent.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if res, err := a.Do(t.Context(), "old", "create_ticket", ticketArgs("old"), agent.DoOptions{}); err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("old action once settled: %+v, %v", res, err)
	}
	res, err = a.Do(t.Context(), "new", "create_ticket", ticketArgs("new"), agent.DoOptions{Supersedes: "old"})
	sent := s.sent()
	if err != nil || res.State != agent.StateSucceeded || sent[len(sent)-1].Get("Supersedes-Operation-Id") != "op_old" {
		t.Fatalf("new action after the old one settled: %+v, %v, Supersedes-Operation-Id %q; want sent, naming op_old",
			res, err, sent[len(sent)-1].Get("Supersedes-Operation-Id"))
	}
}

// For a write that takes approvals, a person may decide to replace an unknown operation anyway: the held action
// goes with the approval. A service that refuses the replacement (409 superseded_operation_unknown) is
// needs_human too, never a final refusal.
func TestSupersedingAnUnknownOperationWithApproval(t *testing.T) {
	t.Parallel()
	s := newScripted(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Approval-Id") != "":
			answerWith(http.StatusOK, map[string]string{"Operation-Id": "op_new"}, `{"id":"pi_1","status":"captured"}`)(w, r)
		case r.Header.Get("Supersedes-Operation-Id") != "":
			answerWith(http.StatusConflict, nil, `{"status":409,"code":"superseded_operation_unknown","operation_id":"op_old"}`)(w, r)
		default:
			answerWith(http.StatusAccepted, map[string]string{"Operation-Id": "op_old", "Retry-After": "1"},
				`{"operation_id":"op_old","state":"unknown"}`)(w, r)
		}
	}, answerWith(http.StatusOK, nil, `{"id":"op_old","state":"unknown"}`))
	cfg := s.config()
	cfg.MaxWait = 200 * time.Millisecond
	a := s.open(t, cfg)
	capture := func(action string, args string, opts agent.DoOptions) agent.Result {
		t.Helper()
		res, err := a.Do(t.Context(), action, "capture_payment", []byte(args), opts)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	capture("cap", `{"intent_id":"pi_1","amount":"10.00"}`, agent.DoOptions{})
	held := capture("cap-v2", `{"intent_id":"pi_1","amount":"9.00"}`, agent.DoOptions{Supersedes: "cap"})
	if held.State != agent.StateNeedsHuman || !strings.Contains(held.NextStep, `request_approval with {"for_action": "cap-v2"}`) ||
		len(s.sent()) != 1 {
		t.Fatalf("held: %+v, %d sends; want needs_human pointing to request_approval, nothing sent", held, len(s.sent()))
	}
	approved := capture("cap-v2", `{"intent_id":"pi_1","amount":"9.00","approval_id":"apv_1"}`, agent.DoOptions{Supersedes: "cap"})
	last := s.sent()[len(s.sent())-1]
	if approved.State != agent.StateSucceeded || last.Get("Approval-Id") != "apv_1" || last.Get("Supersedes-Operation-Id") != "op_old" {
		t.Fatalf("with the approval: %+v, sent Approval-Id %q Supersedes-Operation-Id %q", approved, last.Get("Approval-Id"),
			last.Get("Supersedes-Operation-Id"))
	}

	// The agent thought the old operation settled; the service holds it unknown and refuses.
	s2 := newScripted(t, sequence(answerWith(http.StatusOK, map[string]string{"Operation-Id": "op_old"}, `{"id":"pi_1"}`),
		answerWith(http.StatusConflict, nil, `{"status":409,"code":"superseded_operation_unknown","operation_id":"op_old"}`)), nil)
	a2 := s2.open(t, s2.config())
	if _, err := a2.Do(t.Context(), "cap", "capture_payment", []byte(`{"intent_id":"pi_1"}`), agent.DoOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := a2.Do(t.Context(), "cap-v2", "capture_payment", []byte(`{"intent_id":"pi_1","amount":"1.00"}`), agent.DoOptions{Supersedes: "cap"})
	if err != nil || res.State != agent.StateNeedsHuman || res.Code != agent.CodeSupersededUnknown || len(s2.sent()) != 2 {
		t.Errorf("refused by the service: %+v, %v; want needs_human %s after one send", res, err, agent.CodeSupersededUnknown)
	}
}

// A journal written before keys were derived (a key made at random, no namespace) and before unknown was a
// state of its own (a server-side unknown settled in_progress) is read, shown and resumed with the key it
// holds.
func TestOldJournalKeepsItsKey(t *testing.T) {
	t.Parallel()
	s := newScripted(t, answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_1", "Idempotent-Replayed": "true"}, `{"id":"tkt_1"}`),
		answerWith(http.StatusOK, nil, `{"id":"op_1","state":"succeeded"}`))
	path := filepath.Join(t.TempDir(), "old.journal")
	at := auditchain.FormatTime(time.Now())
	writeJournal(t, path, "jnl_old",
		map[string]any{"type": agent.RecJournalOpened, "at": at, "format": 1},
		map[string]any{"type": agent.RecRunStarted, "run_id": "run_old", "command": "agent do", "started_at": at},
		map[string]any{"type": agent.RecOperationCreated, "operation_id": "aop_old", "action_id": "old", "idempotency_key": "idk_random",
			"tool": "create_ticket", "service": agent.Tickets, "method": "POST", "route_template": "/v1/tickets", "path": "/v1/tickets",
			"args": map[string]any{"project": "ops", "title": "old"}, "fingerprint": "f", "retry_mode": "create", "budget": 5,
			"authority_ref": "env:AGENT_API_KEY", "run_id": "run_old", "at": at},
		map[string]any{"type": agent.RecAttemptStarted, "operation_id": "aop_old", "attempt_id": "att_1", "number": 1,
			"decision": "first_attempt", "budget_left": 4, "run_id": "run_old", "at": at},
		map[string]any{"type": agent.RecAttemptFinished, "operation_id": "aop_old", "attempt_id": "att_1", "dispatch_state": "response_received",
			"status": 202, "server_operation_id": "op_1", "server_state": "unknown", "duration_ms": 3, "at": at},
		map[string]any{"type": agent.RecOperationSettled, "operation_id": "aop_old", "state": agent.StateInProgress,
			"reason": "the service is still working on it (unknown)", "next_step": "call again", "run_id": "run_old", "at": at})
	j, err := agent.ReadJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	op, _ := j.Operation("old")
	var show strings.Builder
	op.WriteTimeline(&show)
	if !strings.Contains(show.String(), "key         idk_random (made and journaled") {
		t.Errorf("show of an old journal:\n%s", show.String())
	}
	cfg := s.config()
	cfg.SameAccount = true
	a, err := agent.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	results, err := a.Resume(t.Context())
	if err != nil || len(results) != 1 || results[0].State != agent.StateSucceeded || len(s.sent()) != 1 ||
		s.sent()[0].Get("Idempotency-Key") != "idk_random" {
		t.Fatalf("Resume = %+v, %v, %d sends; want succeeded with the journal's own key", results, err, len(s.sent()))
	}
}

// An action held because it supersedes an operation of unknown outcome says what a person deciding on it must
// know of that operation (its ids, its last dispatch, why it is unknown), and the approval it asks for names that
// operation, so the service shows it to the approver and lets the replacement through with that approval only.
func TestHeldReplacementCarriesThePriorOperation(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var approvalBodies []map[string]any
	s := newScripted(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/approvals":
			var body map[string]any
			_ = json.NewDecoder(r.Body).Decode(&body)
			mu.Lock()
			approvalBodies = append(approvalBodies, body)
			mu.Unlock()
			answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_apv"}, `{"id":"apv_1","state":"pending"}`)(w, r)
		case r.Header.Get("Approval-Id") != "":
			answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_new"}, `{"id":"re_2"}`)(w, r)
		default:
			answerWith(http.StatusAccepted, map[string]string{"Operation-Id": "op_old", "Retry-After": "1"},
				`{"operation_id":"op_old","state":"unknown"}`)(w, r)
		}
	}, answerWith(http.StatusOK, nil, `{"id":"op_old","state":"unknown"}`))
	cfg := s.config()
	cfg.MaxWait = 200 * time.Millisecond
	a := s.open(t, cfg)
	if _, err := a.Do(t.Context(), "ref", "refund_payment", []byte(`{"intent_id":"pi_1","amount":"3.00"}`), agent.DoOptions{}); err != nil {
		t.Fatal(err)
	}
	held, err := a.Do(t.Context(), "ref-v2", "refund_payment", []byte(`{"intent_id":"pi_1","amount":"2.00"}`), agent.DoOptions{Supersedes: "ref"})
	if err != nil || held.State != agent.StateNeedsHuman || held.Code != agent.CodeSupersededUnknown ||
		!strings.Contains(held.Reason, "service operation op_old") || !strings.Contains(held.Reason, "its last dispatch: response_received") ||
		!strings.Contains(held.Reason, "the service holds it as unknown") {
		t.Fatalf("held: %+v, %v; want needs_human saying the prior operation, its last dispatch and why", held, err)
	}
	apv, err := a.Do(t.Context(), "apv", "request_approval", []byte(`{"for_action":"ref-v2"}`), agent.DoOptions{})
	mu.Lock()
	defer mu.Unlock()
	if err != nil || apv.State != agent.StateSucceeded || len(approvalBodies) != 1 ||
		approvalBodies[0]["supersedes_operation_id"] != "op_old" || approvalBodies[0]["idempotency_key"] == nil {
		t.Fatalf("request_approval: %+v, %v, bodies %v; want the approval naming op_old", apv, err, approvalBodies)
	}
	done, err := a.Do(t.Context(), "ref-v2", "refund_payment", []byte(`{"intent_id":"pi_1","amount":"2.00","approval_id":"apv_1"}`),
		agent.DoOptions{Supersedes: "ref"})
	last := s.sent()[len(s.sent())-1]
	if err != nil || done.State != agent.StateSucceeded || last.Get("Supersedes-Operation-Id") != "op_old" || last.Get("Approval-Id") != "apv_1" {
		t.Fatalf("with the approval: %+v, %v", done, err)
	}
}
