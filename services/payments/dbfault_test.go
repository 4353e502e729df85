package payments_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/faultproxy"
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// proxiedBundle is a payments service whose database connections go through a fault proxy; b.db and the
// recovery worker still reach the schema directly. requests holds each request's context by Idempotency-Key,
// so a test can see the server notice a caller that hung up.
type proxiedBundle struct {
	*bundle
	proxy    *faultproxy.Proxy
	env      *servicetest.Env
	requests *sync.Map
}

func (h *harness) setupProxied(t *testing.T, lease time.Duration) *proxiedBundle {
	t.Helper()
	env := servicetest.New(t, servicetest.ThroughProxy(database.Options{
		MaxConns: 4, ConnectTimeout: time.Second, AcquireTimeout: time.Second, StatementTimeout: 2 * time.Second,
	}))
	env.Idem.Lease = lease
	client := provider.NewClientHTTP(h.providerURL, merchantSecret(t), apitest.HTTPClient(t, 2*time.Second))
	svc, err := payments.New(env.Deps, payments.Config{
		Provider: client, ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	// As env.Serve does, with one more middleware that records each request's context.
	requests := &sync.Map{}
	capture := func(c *gin.Context) {
		if key := c.GetHeader("Idempotency-Key"); key != "" {
			requests.Store(key, c.Request.Context())
		}
	}
	env.Idem.Reconcilers = service.Reconcilers(svc)
	srv := httptest.NewServer(service.Handler(env.Deps, service.HTTP{Keys: env.Keys, Middleware: []gin.HandlerFunc{capture}}, svc))
	t.Cleanup(srv.Close)
	env.URL = srv.URL
	agent := apitest.New(t, srv.URL, servicetest.AgentSecret)
	return &proxiedBundle{proxy: env.Proxy, env: env, requests: requests, bundle: &bundle{
		agent: agent, approver: agent.As(servicetest.ApproverSecret), other: agent.As(servicetest.OtherAgentSecret),
		provider: client, db: env.DB,
		recovery: &opstatus.RecoveryWorker{DB: env.DB.Pool, Reconcilers: svc.Reconcilers(), Logger: env.Logger, Clock: env.Clock},
	}}
}

// testRefundRecordLost is issue 8's first finding: the provider refunds, then the database goes away before
// the refund is recorded. The answer must name the operation and say that the outcome is unknown (never
// "nothing was done", which invites a second refund under a new key); once the database is back the same key
// settles into the one refund the provider made.
func testRefundRecordLost(t *testing.T, h *harness) {
	b := h.setupProxied(t, 3*time.Second)
	in := b.createIntent(t, "o-lost-rec", `{"order_id":"o-lost-rec","amount":"10.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap")).Status(t, http.StatusOK)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindRefund, Mode: provider.FaultDelay, Count: 1, DelayMS: 1000}); err != nil {
		t.Fatal(err)
	}

	path := "/v1/payment_intents/" + in.ID + "/refunds"
	answer := make(chan *apitest.Response, 1)
	go func() { answer <- b.agent.Post(path, `{"amount":"3.00","reason":"partial"}`, apitest.Key("refund-1")) }()
	servicetest.Eventually(t, "the provider executes the refund", func() bool {
		got, err := b.provider.Counters(t.Context())
		return err == nil && got["refund"] == 1
	})
	// The refund is done at the provider and its answer is on the way: the database goes away now.
	b.proxy.Refuse(true)
	b.proxy.CutAll()

	first := (<-answer).Status(t, http.StatusServiceUnavailable)
	opID := first.Header.Get("Operation-Id")
	if code(t, first) != "outcome_unknown" || opID == "" || first.Str(t, "operation_id") != opID ||
		first.Str(t, "state") != "unknown" || first.Header.Get("Retry-After") == "" {
		t.Fatalf("answer after the refund = %s %v; want outcome_unknown naming the operation", first.Body, first.Header)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})

	b.proxy.Refuse(false)
	// The lease runs out; the recovery worker finds the refund at the provider and records it.
	servicetest.Eventually(t, "the operation settles", func() bool {
		n, err := b.recovery.RunOnce(t.Context())
		return err == nil && n == 1
	})
	retry := b.agent.Post(path, `{"amount":"3.00","reason":"partial"}`, apitest.Key("refund-1")).Status(t, http.StatusCreated)
	if retry.Header.Get("Operation-Id") != opID || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %s %v; want the stored refund of %s", retry.Body, retry.Header, opID)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})
	if got := b.getIntent(t, in.ID); got.RefundedMinor != 300 {
		t.Fatalf("intent refunded %d; want 300", got.RefundedMinor)
	}
	auth, err := b.provider.GetAuthorization(t.Context(), *b.getIntentFull(t, in.ID).ProviderAuthorizationID)
	if err != nil || auth.RefundedMinor != 300 {
		t.Fatalf("provider authorization = %+v, %v; want 300 refunded", auth, err)
	}
	var refunds int64
	b.db.Raw(`SELECT count(*) FROM payment_refunds WHERE intent_id = ? AND status = 'succeeded' AND amount_minor = 300`, in.ID).Scan(&refunds)
	if refunds != 1 {
		t.Fatalf("%d succeeded refund rows; want 1", refunds)
	}
}

func (b *bundle) getIntentFull(t *testing.T, id string) payments.Intent {
	t.Helper()
	var in payments.Intent
	b.agent.Get("/v1/payment_intents/"+id).Status(t, http.StatusOK).Decode(t, &in)
	return in
}

// testCallerHangsUpDuringClaim: an agent killed while its intent's claim commits. The server still creates the
// intent at the provider, once, and a retry with the same key gets that first answer, not 409 for the whole
// lease and then a failure that demands a new key.
func testCallerHangsUpDuringClaim(t *testing.T, h *harness) {
	b := h.setupProxied(t, 5*time.Second)
	const key = "create-hangup"
	hungUp := make(chan struct{})
	clientCtx, hangUp := context.WithCancel(t.Context())
	defer hangUp()
	unset := failpoint.Set("idem.external.claimed", func(detail any) {
		if op, ok := detail.(opstatus.Operation); !ok || op.IdempotencyKey != key || op.Kind != payments.KindCreateIntent {
			return
		}
		b.proxy.Stall(true)
		go func() {
			defer close(hungUp)
			servicetest.Eventually(t, "the COMMIT leaves the service", func() bool { return b.proxy.Held() > 0 })
			hangUp()
			servicetest.Eventually(t, "the server sees the caller gone", func() bool {
				ctx, ok := b.requests.Load(key)
				return ok && ctx.(context.Context).Err() != nil
			})
			b.proxy.Stall(false)
		}()
	})
	defer unset()
	body := `{"order_id":"o-hangup","amount":"12.00","currency":"USD"}`
	req, _ := http.NewRequestWithContext(clientCtx, http.MethodPost, b.env.URL+"/v1/payment_intents", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+servicetest.AgentSecret)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the first attempt got an answer (%d); the test meant to hang up before it", resp.StatusCode)
	}
	<-hungUp

	servicetest.Eventually(t, "the intent is created without its caller", func() bool {
		var n int64
		b.db.Raw(`SELECT count(*) FROM operations WHERE idempotency_key = ? AND key_state = 'completed'`, key).Scan(&n)
		return n == 1
	})
	var in intent
	retry := b.agent.Post("/v1/payment_intents", body, apitest.Key(key)).Status(t, http.StatusCreated)
	retry.Decode(t, &in)
	if retry.Header.Get("Idempotent-Replayed") != "true" || in.Status != "requires_capture" || in.AmountMinor != 1200 {
		t.Fatalf("retry = %s; want the first attempt's intent, authorized (requires_capture)", retry.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})
	var intents int64
	b.db.Raw(`SELECT count(*) FROM payment_intents WHERE order_id = 'o-hangup'`).Scan(&intents)
	if intents != 1 {
		t.Fatalf("%d intents for the order; want 1", intents)
	}
}

// testUnsentWhenLeaseSpentAtCommit: the claim of an intent commits with too little of its lease left to call
// the provider safely. Nothing reaches the provider, the order is free again, and the same key then creates the
// intent with one authorization.
func testUnsentWhenLeaseSpentAtCommit(t *testing.T, h *harness) {
	b := h.setupProxied(t, 4*time.Second)
	const key = "create-slow-commit"
	var slowed atomic.Bool
	unset := failpoint.Set("idem.external.claimed", func(detail any) {
		if op, ok := detail.(opstatus.Operation); ok && op.IdempotencyKey == key && slowed.CompareAndSwap(false, true) {
			// Less than the dispatch margin (a quarter of the lease) is left after the commit.
			b.env.Clock.Advance(3200 * time.Millisecond)
		}
	})
	defer unset()

	body := `{"order_id":"o-slow-commit","amount":"8.00","currency":"USD"}`
	first := b.agent.Post("/v1/payment_intents", body, apitest.Key(key)).Status(t, http.StatusServiceUnavailable)
	if code(t, first) != "store_unavailable" {
		t.Fatalf("answer = %s; want store_unavailable (not sent)", first.Body)
	}
	b.assertCounters(t, map[string]int64{})
	var failed int64
	b.db.Raw(`SELECT count(*) FROM payment_intents WHERE order_id = 'o-slow-commit' AND status = 'failed'`).Scan(&failed)
	if failed != 1 {
		t.Fatalf("%d failed intents; want the reservation undone (1 failed)", failed)
	}

	var in intent
	b.agent.Post("/v1/payment_intents", body, apitest.Key(key)).Status(t, http.StatusCreated).Decode(t, &in)
	if in.Status != "requires_capture" || in.AmountMinor != 800 {
		t.Fatalf("intent = %+v; want authorized 8.00", in)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})
}

// testFrozenDatabaseBeforeEffect: with the database frozen a payment intent is refused with 503
// store_unavailable once the statement bound runs out, before anything reaches the provider; after the thaw
// the same key authorizes once.
func testFrozenDatabaseBeforeEffect(t *testing.T, h *harness) {
	b := h.setupProxied(t, 5*time.Second)
	body := `{"order_id":"o-frozen","amount":"4.00","currency":"USD"}`
	b.proxy.Stall(true)
	first := b.agent.Post("/v1/payment_intents", body, apitest.Key("create-frozen")).Status(t, http.StatusServiceUnavailable)
	if code(t, first) != "store_unavailable" || first.Header.Get("Retry-After") == "" {
		t.Fatalf("answer while frozen = %s %v; want store_unavailable with Retry-After", first.Body, first.Header)
	}
	b.proxy.Stall(false)
	b.assertCounters(t, map[string]int64{})
	b.agent.Post("/v1/payment_intents", body, apitest.Key("create-frozen")).Status(t, http.StatusCreated)
	b.assertCounters(t, map[string]int64{"authorize": 1})
}
