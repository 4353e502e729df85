package payments_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// TestStatelessReplicas runs three `serve payments` processes on one database, all calling one provider
// sandbox process, and sends 50 capture keys, one per intent, six concurrent copies each, spread over the
// three. Nothing but the database decides which copy captures: the provider executes one capture per key (its
// own counters and records say so), each intent is captured once in our database, and the six copies of a
// key end with the same answer, byte for byte. A copy that arrives while the capture is out at the provider
// gets 409 request_in_progress and, like an agent, sends the same key again until it gets the final answer (so
// does one refused with 503 store_unavailable, which a loaded machine can cause).
func TestStatelessReplicas(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	bin := proctest.Build(t)
	const secret = "sk_test_replicas"
	prov := proctest.Start(t, bin, []string{"provider"}, nil, "PROVIDER_ADDR")
	env := map[string]string{
		"DATABASE_URL": db.DSN, "DB_MAX_CONNS": "4", "RATE_LIMIT_WRITES_PER_SECOND": "0",
		"PROVIDER_URL": prov.URL, "PROVIDER_SECRET": secret,
	}
	var clients []*apitest.Client
	for _, p := range proctest.StartReplicas(t, bin, 3, []string{"serve", "payments"}, env, "PAYMENTS_ADDR") {
		clients = append(clients, apitest.New(t, p.URL, servicetest.AgentSecret))
	}

	// One intent per capture key, created through the replicas in turn, a few at a time.
	const keys, copies = 50, 6
	intents := make([]intent, keys)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 6)
	for k := range keys {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"order_id":"replica-%d","amount_minor":%d,"currency":"USD"}`, k, 1000+k)
			res := clients[k%len(clients)].Post("/v1/payment_intents", body, apitest.Key(fmt.Sprintf("create-%d", k)))
			if res.Code != http.StatusCreated {
				t.Errorf("create intent %d: %d %s", k, res.Code, res.Body)
				return
			}
			res.Decode(t, &intents[k])
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	answers := apitest.Copies{Clients: clients, Requests: keys, Copies: copies,
		Send: func(c *apitest.Client, k int) (*apitest.Response, error) {
			return c.Try(http.MethodPost, "/v1/payment_intents/"+intents[k].ID+"/capture", `{}`, apitest.Key(fmt.Sprintf("capture-%d", k)))
		},
		Again:   apitest.AgainOn("request_in_progress", "store_unavailable"),
		MaxWait: 200 * time.Millisecond,
	}.Run()
	apitest.AgreeOnce(t, answers, http.StatusOK)
	t.Logf("%d of %d copies were sent again after 409 request_in_progress (or 503 store_unavailable)", apitest.SentAgain(answers), keys*copies)
	for k, as := range answers {
		var got intent
		as[0].Res.Decode(t, &got)
		if got.ID != intents[k].ID || got.Status != "succeeded" || got.CapturedMinor != intents[k].AmountMinor {
			t.Fatalf("capture %d answered %s; want intent %s succeeded with %d captured", k, as[0].Res.Body, intents[k].ID, intents[k].AmountMinor)
		}
	}

	// The provider's own records: one authorization and one capture per key, each capture executed once.
	pc := provider.NewClientHTTP(prov.URL, secret, apitest.HTTPClient(t, 5*time.Second))
	counters, err := pc.Counters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if counters["authorize"] != keys || counters["capture"] != keys || counters["void"] != 0 || counters["refund"] != 0 {
		t.Fatalf("provider counters %v; want %d authorizations and %d captures", counters, keys, keys)
	}
	var captures []struct {
		OperationID, AccountID, IdempotencyKey, IntentID, AuthorizationID string
		AmountMinor, CapturedMinor                                        int64
		Status                                                            string
	}
	if err := db.Raw(`SELECT o.id AS operation_id, o.account_id, o.idempotency_key, i.id AS intent_id, i.provider_authorization_id AS authorization_id,
       i.amount_minor, i.captured_minor, i.status
FROM operations o JOIN payment_intents i ON i.id = o.resource_id
WHERE o.kind = ? AND o.state = 'succeeded' ORDER BY i.id`, payments.KindCapture).Scan(&captures).Error; err != nil {
		t.Fatal(err)
	}
	if len(captures) != keys {
		t.Fatalf("%d succeeded capture operations on intents; want %d", len(captures), keys)
	}
	seen := map[string]bool{}
	for _, c := range captures {
		if seen[c.IntentID] || c.Status != "succeeded" || c.CapturedMinor != c.AmountMinor {
			t.Fatalf("capture %+v: want one per intent, succeeded, the whole amount captured", c)
		}
		seen[c.IntentID] = true
		look, err := pc.Lookup(t.Context(), payments.DownstreamKey(opstatus.Operation{AccountID: c.AccountID, IdempotencyKey: c.IdempotencyKey}))
		if err != nil || !look.Found || look.Status != http.StatusOK || len(look.Effects) != 1 {
			t.Fatalf("provider's record of capture %s: %+v %v; want found, 200, one effect", c.OperationID, look, err)
		}
		auth, err := pc.GetAuthorization(t.Context(), c.AuthorizationID)
		if err != nil || auth.Status != provider.StatusCaptured || auth.CapturedMinor != c.AmountMinor {
			t.Fatalf("provider's authorization %s: %+v %v; want captured, %d", c.AuthorizationID, auth, err, c.AmountMinor)
		}
	}
	var ops, replays int64
	db.Raw(`SELECT count(*) FROM operations WHERE kind = ?`, payments.KindCapture).Scan(&ops)
	db.Raw(`SELECT count(*) FROM operation_events e JOIN operations o ON o.id = e.operation_id
WHERE o.kind = ? AND e.type = 'replayed'`, payments.KindCapture).Scan(&replays)
	if ops != keys || replays != keys*(copies-1) {
		t.Fatalf("%d capture operations, %d replayed records; want %d, %d", ops, replays, keys, keys*(copies-1))
	}
	servicetest.AuditIntact(t, db.DB)
}
