package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/metricstest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/services/provider"
)

// startRun runs the real program with args and vars until the test ends, and returns once addr is ready.
func startRun(t *testing.T, args []string, vars map[string]string, ready string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(vars), &syncWriter{w: &bytes.Buffer{}}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("run %v did not stop within 15s", args)
		}
	})
	waitHealthy(t, ready, done)
}

// TestMetricsCountTicketsTraffic sends known traffic to the real tickets service and checks that /metrics moved
// by exactly what it should: one create, one replay, one reused key, one missing key, by route template.
func TestMetricsCountTicketsTraffic(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	addr := proctest.FreeAddr(t)
	const account, secret = "acct_metrics_secret_account", "metrics-secret-key-0123456789"
	startRun(t, []string{"serve", "tickets"}, map[string]string{
		"DATABASE_URL": db.DSN, "TICKETS_ADDR": addr, "API_KEYS": account + ":agent:" + secret, "API_KEY_ID_SECRET": testIDSecret,
	}, "http://"+addr+"/readyz")
	c := apitest.New(t, "http://"+addr, secret)

	before := metricstest.Scrape(t, c)
	const key = "metrics-key-7f3a9c"
	var ticket struct{ ID string }
	c.Post("/v1/tickets", `{"project":"ops","title":"counted"}`, apitest.Key(key)).Status(t, http.StatusCreated).Decode(t, &ticket)
	c.Post("/v1/tickets", `{"title":"counted","project":"ops"}`, apitest.Key(key)).Status(t, http.StatusCreated)
	c.Post("/v1/tickets", `{"project":"ops","title":"another"}`, apitest.Key(key)).Status(t, http.StatusUnprocessableEntity)
	c.Post("/v1/tickets", `{"project":"ops","title":"no key"}`).Status(t, http.StatusBadRequest)
	c.Get("/v1/tickets/"+ticket.ID).Status(t, http.StatusOK)
	res, err := http.Get("http://" + addr + "/no/such/route/" + ticket.ID)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	after := metricstest.Scrape(t, c)

	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"retrysafe_idempotency_requests_total", []string{"kind", "tickets.create", "outcome", "created"}, 1},
		{"retrysafe_idempotency_requests_total", []string{"kind", "tickets.create", "outcome", "replayed"}, 1},
		{"retrysafe_idempotency_requests_total", []string{"kind", "tickets.create", "outcome", "conflict"}, 1},
		{"retrysafe_idempotency_requests_total", []string{"kind", "tickets.create", "outcome", "refused"}, 1},
		{"retrysafe_idempotency_requests_total", []string{"kind", "tickets.create"}, 4},
		{"retrysafe_operations_finished_total", []string{"kind", "tickets.create", "state", "succeeded"}, 1},
		{"retrysafe_http_requests_total", []string{"service", "tickets", "route", "/v1/tickets", "method", "POST", "code", "201"}, 2},
		{"retrysafe_http_requests_total", []string{"service", "tickets", "route", "/v1/tickets", "method", "POST", "code", "422"}, 1},
		{"retrysafe_http_requests_total", []string{"service", "tickets", "route", "/v1/tickets", "method", "POST", "code", "400"}, 1},
		{"retrysafe_http_requests_total", []string{"service", "tickets", "route", "/v1/tickets/:id", "method", "GET", "code", "200"}, 1},
		{"retrysafe_http_requests_total", []string{"service", "tickets", "route", "unmatched", "method", "GET", "code", "404"}, 1},
		{"retrysafe_http_request_duration_seconds", []string{"service", "tickets", "route", "/v1/tickets", "method", "POST"}, 4},
	} {
		if got := after.Delta(before, tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v moved by %v; want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if got := after.Value("retrysafe_operations_unknown"); got != 0 || !after.Has("retrysafe_operations_unknown") {
		t.Errorf("retrysafe_operations_unknown = %v (present %v); want 0", got, after.Has("retrysafe_operations_unknown"))
	}
	for _, private := range []string{account, secret, key, ticket.ID, "/no/such"} {
		if strings.Contains(after.Body, private) {
			t.Errorf("/metrics shows %q; labels must never carry accounts, keys, ids or raw paths", private)
		}
	}
}

// TestMetricsCountALostProviderAnswer runs payments against a real provider that executes a capture and drops
// the connection: /metrics shows the unknown outcome, the unknown operation and the provider call; the retry
// that settles it shows the reconcile, the replay and the finished operation, and the provider captured once.
func TestMetricsCountALostProviderAnswer(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	providerAddr, paymentsAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	startRun(t, []string{"provider"}, map[string]string{
		"PROVIDER_ADDR": providerAddr, "PROVIDER_FAULT_INJECTION": "true",
	}, "http://"+providerAddr+"/healthz")
	const merchant = "sk_test_metrics_lost_capture"
	startRun(t, []string{"serve", "payments"}, map[string]string{
		"DATABASE_URL": db.DSN, "PAYMENTS_ADDR": paymentsAddr, "PROVIDER_URL": "http://" + providerAddr,
		"PROVIDER_SECRET": merchant, "API_KEYS": "acct_metrics:agent:metrics-agent-0123456789abc", "API_KEY_ID_SECRET": testIDSecret,
		// The recovery worker must leave the unknown capture to the retry, so the test sees it unknown first.
		"RECOVERY_INTERVAL": "1h",
	}, "http://"+paymentsAddr+"/readyz")
	c := apitest.New(t, "http://"+paymentsAddr, "metrics-agent-0123456789abc")
	prov := provider.NewClient("http://"+providerAddr, merchant, 5*time.Second)

	var in struct{ ID string }
	c.Post("/v1/payment_intents", `{"order_id":"o-metrics","amount":"25.00","currency":"USD"}`, apitest.Key("create-o-metrics")).
		Status(t, http.StatusCreated).Decode(t, &in)
	if err := prov.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDrop, Count: 1}); err != nil {
		t.Fatal(err)
	}
	before := metricstest.Scrape(t, c)
	path := "/v1/payment_intents/" + in.ID + "/capture"
	c.Post(path, `{}`, apitest.Key("cap-metrics")).Status(t, http.StatusAccepted)
	lost := metricstest.Scrape(t, c)

	check := func(s metricstest.Sample, name string, labels []string, want float64) {
		t.Helper()
		if got := s.Delta(before, name, labels...); got != want {
			t.Errorf("%s%v moved by %v; want %v", name, labels, got, want)
		}
	}
	check(lost, "retrysafe_idempotency_requests_total", []string{"kind", "payments.capture", "outcome", "unknown"}, 1)
	check(lost, "retrysafe_downstream_request_duration_seconds", []string{"target", "provider", "outcome", "unknown"}, 1)
	if got := lost.Value("retrysafe_operations_unknown"); got != 1 {
		t.Errorf("retrysafe_operations_unknown = %v after the lost answer; want 1", got)
	}
	if !lost.Has("retrysafe_operation_oldest_unknown_seconds") || lost.Value("retrysafe_operation_oldest_unknown_seconds") < 0 {
		t.Error("retrysafe_operation_oldest_unknown_seconds missing or negative")
	}

	// The retry asks the reconciler at once: it finds the capture at the provider and replays it.
	retry := c.Post(path, `{}`, apitest.Key("cap-metrics")).Status(t, http.StatusOK)
	if retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the lost answer = %s; want the settled capture replayed", retry.Body)
	}
	settled := metricstest.Scrape(t, c)
	check(settled, "retrysafe_reconcile_total", []string{"kind", "payments.capture", "result", "settled"}, 1)
	check(settled, "retrysafe_idempotency_requests_total", []string{"kind", "payments.capture", "outcome", "replayed"}, 1)
	check(settled, "retrysafe_operations_finished_total", []string{"kind", "payments.capture", "state", "succeeded"}, 1)
	check(settled, "retrysafe_downstream_request_duration_seconds", []string{"target", "provider", "outcome", "ok"}, 1) // the lookup
	if got := settled.Value("retrysafe_operations_unknown"); got != 0 {
		t.Errorf("retrysafe_operations_unknown = %v after settling; want 0", got)
	}
	if got := settled.Value("retrysafe_operation_oldest_unknown_seconds"); got != 0 {
		t.Errorf("retrysafe_operation_oldest_unknown_seconds = %v with nothing unknown; want 0", got)
	}
	counters, err := prov.Counters(t.Context())
	if err != nil || counters["capture"] != 1 {
		t.Errorf("provider captures = %v, %v; want exactly 1", counters, err)
	}
}

// TestMetricsCountADeploy runs the real deploys service: a deploy the controller finishes shows as a finished
// operation and as calls to the deploy target; a cancelled one as a cancelled operation.
func TestMetricsCountADeploy(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	addr := proctest.FreeAddr(t)
	startRun(t, []string{"serve", "deploys"}, map[string]string{
		"DATABASE_URL": db.DSN, "DEPLOYS_ADDR": addr, "API_KEYS": "acct_metrics:agent:metrics-agent-0123456789abc", "API_KEY_ID_SECRET": testIDSecret,
		// One step of 2s: the cancel below lands long before activation could start.
		"DEPLOY_STEPS": "1", "DEPLOY_STEP_DURATION": "2s", "DEPLOY_POLL_INTERVAL": "20ms",
	}, "http://"+addr+"/readyz")
	c := apitest.New(t, "http://"+addr, "metrics-agent-0123456789abc")
	before := metricstest.Scrape(t, c)

	const artifact = "registry.example.com/shop/api@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	var cancelled struct{ ID, State string }
	c.Post("/v1/deploys", `{"service":"shop","environment":"qa","artifact":"`+artifact+`"}`, apitest.Key("dep-metrics-cancel")).
		Status(t, http.StatusAccepted).Decode(t, &cancelled)
	c.Post("/v1/deploys/"+cancelled.ID+"/cancel", nil).Status(t, http.StatusOK).Decode(t, &cancelled)
	if cancelled.State != "cancelled" {
		t.Fatalf("deploy after cancel is %s; want cancelled", cancelled.State)
	}
	c.Post("/v1/deploys/"+cancelled.ID+"/cancel", nil).Status(t, http.StatusOK) // cancelling again finishes nothing

	var d struct{ ID, State string }
	c.Post("/v1/deploys", `{"service":"shop","environment":"staging","artifact":"`+artifact+`"}`, apitest.Key("dep-metrics")).
		Status(t, http.StatusAccepted).Decode(t, &d)
	servicetest.Eventually(t, "deploy succeeded", func() bool {
		c.Get("/v1/deploys/"+d.ID).Status(t, http.StatusOK).Decode(t, &d)
		return d.State == "succeeded"
	})
	// The controller counts the deploy once its success is committed, so a GET can see it first.
	var after metricstest.Sample
	servicetest.Eventually(t, "the success counted", func() bool {
		after = metricstest.Scrape(t, c)
		return after.Delta(before, "retrysafe_operations_finished_total", "kind", "deploys.create", "state", "succeeded") > 0
	})
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"retrysafe_idempotency_requests_total", []string{"kind", "deploys.create", "outcome", "created"}, 2},
		{"retrysafe_operations_finished_total", []string{"kind", "deploys.create", "state", "cancelled"}, 1},
		{"retrysafe_operations_finished_total", []string{"kind", "deploys.create", "state", "succeeded"}, 1},
		// Each create first asks the target whether it activated that deploy id before (two), then the deploy that
		// runs is activated (one).
		{"retrysafe_downstream_request_duration_seconds", []string{"target", "deploy_target", "outcome", "ok"}, 3},
	} {
		if got := after.Delta(before, tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v moved by %v; want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
