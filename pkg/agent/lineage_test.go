package agent_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// A 400 about the attempt's own lineage headers (here Retry-Of) refuses how the attempt described itself, not
// the action: the agent sends again with the same key and without Retry-Of, and settles from that answer.
func TestLineageRefusalIsNotASettlement(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	first := ""
	writes := sequence(loseAnswer,
		answerWith(http.StatusBadRequest, nil, `{"type":"about:blank","status":400,"code":"invalid_request",`+
			`"detail":"the Retry-Of header names no earlier attempt of this operation","header":"Retry-Of"}`),
		answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_l"}, `{"id":"tkt_1"}`))
	s := newScripted(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if first == "" {
			first = r.Header.Get("Attempt-Id")
		}
		mu.Unlock()
		writes(w, r)
	}, func(w http.ResponseWriter, r *http.Request) {
		// The lookup lists the first attempt (its claim), so the retry names it.
		mu.Lock()
		raw, _ := json.Marshal(map[string]any{"items": []any{map[string]any{"id": "op_l", "state": "running",
			"events": []any{map[string]any{"detail": map[string]any{"attempt_id": first}}}}}})
		mu.Unlock()
		answerWith(http.StatusOK, nil, string(raw))(w, r)
	})
	a := s.open(t, s.config())
	res, err := a.Do(t.Context(), "l", "create_ticket", ticketArgs("lineage"), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("Do = %+v, %v; want succeeded, never refused", res, err)
	}
	sent := s.sent()
	if len(sent) != 3 || sent[1].Get("Retry-Of") != first || sent[2].Get("Retry-Of") != "" || sent[2].Get("Retry-Reason") != "" ||
		sent[2].Get("Idempotency-Key") != sent[0].Get("Idempotency-Key") {
		t.Fatalf("writes %v; want the retry naming %s, then the same key without Retry-Of", sent, first)
	}
}

// A capture whose provider call is slow outlasts the agent's attempt. The lookup lists the running attempt (its
// claim), and the retry names it in Retry-Of: the service treats it as it would without the header (it waits,
// Prefer: wait, and replays the capture once it ends; or answers 409 request_in_progress), never 400. The
// capture settles succeeded, captured once at the provider.
func TestRetryOfARunningCapture(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t)
	prov := proctest.Start(t, bin, []string{"provider"}, map[string]string{"PROVIDER_FAULT_INJECTION": "true"}, "PROVIDER_ADDR")
	env := servicetest.New(t)
	client := provider.NewClientHTTP(prov.URL, "sk_test_"+strings.ReplaceAll(t.Name(), "/", "_"), apitest.HTTPClient(t, 10*time.Second))
	svc, err := payments.New(env.Deps, payments.Config{Provider: client, ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, svc)
	a, err := agent.Open(filepath.Join(t.TempDir(), "agent.journal"), agent.Config{
		PaymentsURL: env.URL, APIKey: servicetest.AgentSecret, AuthorityRef: "test:demo-agent", Warn: func(string) {},
		AttemptTimeout: 1500 * time.Millisecond, BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Budget: 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	res, err := a.Do(t.Context(), "intent", "create_payment_intent", json.RawMessage(`{"order_id":"o-slow","amount":"10.00","currency":"USD"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("intent: %+v, %v", res, err)
	}
	var in struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(res.Body, &in); err != nil || in.ID == "" {
		t.Fatalf("intent body %s: %v", res.Body, err)
	}
	if err := client.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDelay, Count: 1, DelayMS: 3000}); err != nil {
		t.Fatal(err)
	}
	res, err = a.Do(t.Context(), "capture", "capture_payment", json.RawMessage(`{"intent_id":"`+in.ID+`"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("capture: %+v, %v; want succeeded, never refused", res, err)
	}
	counters, err := client.Counters(t.Context())
	if err != nil || counters["capture"] != 1 {
		t.Fatalf("provider counters %v, %v; want one capture", counters, err)
	}
	op, _ := a.Operation("capture")
	first := op.Attempts[0]
	refused := slices.ContainsFunc(op.Attempts, func(at *agent.Attempt) bool {
		return at.Finished != nil && at.Finished.Status >= 400 && at.Finished.Status < 500 && at.Finished.Code != "request_in_progress"
	})
	if first.Finished == nil || first.Finished.DispatchState != agent.SentNoResponse || len(op.Attempts) < 2 ||
		op.Attempts[1].RetryOfSent != first.AttemptID || refused {
		t.Fatalf("attempts %s; want the first sent_no_response, a retry naming it, and no 4xx but request_in_progress", attemptsOf(op))
	}
}

func attemptsOf(op *agent.Operation) string {
	var out []string
	for _, at := range op.Attempts {
		line := at.AttemptID + " retry_of_sent=" + at.RetryOfSent
		if at.Finished != nil {
			line += fmt.Sprintf(" %s %d %s", at.Finished.DispatchState, at.Finished.Status, at.Finished.Code)
		}
		out = append(out, line)
	}
	return strings.Join(out, "; ")
}
