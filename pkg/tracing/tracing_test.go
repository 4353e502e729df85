package tracing_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/tracing"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// The tests of this file run in order: the first while tracing is off, as it is by default, the second turns
// it on for the process.

// TestOffByDefault: before Setup or Use nothing is traced: Start hands the context back without allocating, and
// neither the transport nor the agent's request carries a traceparent.
func TestOffByDefault(t *testing.T) {
	if tracing.Enabled() {
		t.Fatal("tracing is on before anything turned it on")
	}
	ctx := context.Background()
	if allocs := testing.AllocsPerRun(100, func() {
		c, span := tracing.Start(ctx, "idem.claim")
		span.End()
		if c != ctx {
			t.Fatal("Start changed the context with tracing off")
		}
	}); allocs != 0 {
		t.Errorf("Start with tracing off allocates %v times; want 0", allocs)
	}
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Clone() }))
	defer srv.Close()
	res, err := (&http.Client{Transport: tracing.Transport(nil)}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if v := got.Get("Traceparent"); v != "" {
		t.Errorf("the transport sent traceparent %q with tracing off", v)
	}
}

// TestOneActionOneTrace follows one payment intent made by the agent through payments to the provider sandbox
// (each over real HTTP) and reads every span from an in-memory exporter: all of them are one trace, holding the
// agent's attempt, the service's request with idem's claim, dispatch and completion, and the provider's
// request; the agent's journal records that trace. A ticket, a local write, has its claim, write and
// completion in a trace of its own.
func TestOneActionOneTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tracing.Use(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))

	prov := httptest.NewServer(tracing.Handler(provider.NewServer(provider.Config{}, nil).Handler()))
	defer prov.Close()
	env := servicetest.New(t)
	pay, err := payments.New(env.Deps, payments.Config{
		Provider:           provider.NewClientHTTP(prov.URL, "sk_test_tracing", &http.Client{Timeout: 5 * time.Second, Transport: tracing.Transport(nil)}),
		ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, pay)
	paymentsURL := env.URL
	tk, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, tk)

	a, err := agent.Open(filepath.Join(t.TempDir(), "agent.journal"), agent.Config{
		PaymentsURL: paymentsURL, TicketsURL: env.URL, APIKey: servicetest.AgentSecret,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	res, err := a.Do(t.Context(), "pi-traced", "create_payment_intent",
		json.RawMessage(`{"order_id":"order-traced","amount":"25.00","currency":"USD"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("Do = %+v, %v; want succeeded", res, err)
	}
	spans := exp.GetSpans()
	traces := map[trace.TraceID][]string{}
	for _, s := range spans {
		traces[s.SpanContext.TraceID()] = append(traces[s.SpanContext.TraceID()], s.Name)
	}
	if len(traces) != 1 {
		t.Fatalf("one action's spans are in %d traces: %v; want one", len(traces), traces)
	}
	var id trace.TraceID
	var names []string
	for k, v := range traces {
		id, names = k, v
	}
	joined := strings.Join(names, ", ")
	for _, want := range []string{"agent.attempt create_payment_intent", "POST /v1/payment_intents", "idem.claim",
		"idem.dispatch", "idem.complete", "POST /v1/authorizations"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the action's trace lacks %q: %s", want, joined)
		}
	}
	op, _ := a.Operation("pi-traced")
	if len(op.Attempts) != 1 || !strings.Contains(op.Attempts[0].TraceParent, id.String()) {
		t.Errorf("the journal's attempt records traceparent %q; want trace %s", op.Attempts[0].TraceParent, id)
	}

	exp.Reset()
	if res, err := a.Do(t.Context(), "ticket-traced", "create_ticket", json.RawMessage(`{"project":"ops","title":"traced"}`),
		agent.DoOptions{}); err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("Do = %+v, %v; want succeeded", res, err)
	}
	local := map[string]trace.TraceID{}
	for _, s := range exp.GetSpans() {
		local[s.Name] = s.SpanContext.TraceID()
	}
	for _, want := range []string{"idem.claim", "idem.write", "idem.complete"} {
		if tid, ok := local[want]; !ok || tid == id || tid != local["agent.attempt create_ticket"] {
			t.Errorf("the ticket's trace: %s in %v; want it in the ticket action's own trace", want, local)
		}
	}
}
