package payments_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// setupOn is setup with the service calling the provider through p; client is the provider of the test's merchant.
func (h *harness) setupOn(t *testing.T, p payments.Provider, client *provider.Client) *bundle {
	t.Helper()
	env := servicetest.New(t)
	svc, err := payments.New(env.Deps, payments.Config{
		Provider: p, ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	agent := env.Serve(t, svc)
	return &bundle{
		agent: agent, approver: agent.As(servicetest.ApproverSecret), other: agent.As(servicetest.OtherAgentSecret),
		provider: client, db: env.DB,
		recovery: &opstatus.RecoveryWorker{DB: env.DB.Pool, Reconcilers: svc.Reconcilers(), Logger: env.Logger, Clock: env.Clock},
		idem:     env.Idem,
	}
}

// testClaimsLostWithTheDatabase is a failover that loses the newest commits (an asynchronous standby promoted):
// an intent created and captured on the old primary, whose claims, intent and results never reached the new
// one, while the provider holds the authorization and the capture. The agent sends both again with the same
// keys to the new primary (here a second database, one provider merchant): the new claims are new operations,
// and their provider calls replay the first ones, because the provider key comes from the account and the
// Idempotency-Key, not from the lost operation. One authorization and one capture at the provider, and the
// agent gets the success it was promised.
func testClaimsLostWithTheDatabase(t *testing.T, h *harness) {
	old := h.setup(t)
	promoted := h.setup(t) // same test, same merchant at the provider; a database that never saw the writes
	const create = `{"order_id":"o-failover","amount":"31.00","currency":"USD"}`
	var first, again struct {
		ID                      string `json:"id"`
		Status                  string `json:"status"`
		CapturedMinor           int64  `json:"captured_minor"`
		ProviderAuthorizationID string `json:"provider_authorization_id"`
	}
	old.agent.Post("/v1/payment_intents", create, apitest.Key("create-f")).Status(t, http.StatusCreated).Decode(t, &first)
	old.agent.Post("/v1/payment_intents/"+first.ID+"/capture", `{}`, apitest.Key("capture-f")).Status(t, http.StatusOK)
	old.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})

	res := promoted.agent.Post("/v1/payment_intents", create, apitest.Key("create-f")).Status(t, http.StatusCreated)
	res.Decode(t, &again)
	if again.ProviderAuthorizationID != first.ProviderAuthorizationID || res.Header.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("create on the new primary = %s; want a new intent on the first authorization %s", res.Body, first.ProviderAuthorizationID)
	}
	res = promoted.agent.Post("/v1/payment_intents/"+again.ID+"/capture", `{}`, apitest.Key("capture-f")).Status(t, http.StatusOK)
	res.Decode(t, &again)
	if again.Status != "succeeded" || again.CapturedMinor != 3100 {
		t.Fatalf("capture on the new primary = %s; want succeeded, 3100 captured", res.Body)
	}
	promoted.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	for _, key := range []string{"create-f", "capture-f"} {
		op := operation(t, promoted.agent, key)
		if err := promoted.db.Raw(`SELECT account_id FROM operations WHERE id = ?`, op.ID).Scan(&op.AccountID).Error; err != nil {
			t.Fatal(err)
		}
		look, err := promoted.provider.Lookup(t.Context(), payments.DownstreamKey(op))
		if err != nil || !look.Found || len(look.Effects) != 1 {
			t.Fatalf("provider's record of %s: %+v %v; want found, one effect", key, look, err)
		}
	}
}

// lostCaptures is the provider as payments sees it, with every capture's answer lost before it is sent: the
// capture never reaches the provider, and payments cannot tell.
type lostCaptures struct{ *provider.Client }

func (lostCaptures) Capture(context.Context, string, string, int64) (provider.Capture, error) {
	return provider.Capture{}, fmt.Errorf("%w: the test dropped it", provider.ErrOutcomeUnknown)
}

// testOperationKeyStillReconciles: an operation dispatched before provider keys were derived from the request
// went out under rs-<operation id>. Its reconciler finds it there when the derived key is unknown to the
// provider, and settles it from that record without capturing again.
func testOperationKeyStillReconciles(t *testing.T, h *harness) {
	client := provider.NewClientHTTP(h.providerURL, merchantSecret(t), apitest.HTTPClient(t, 2*time.Second))
	b := h.setupOn(t, lostCaptures{client}, client)
	in := b.createIntent(t, "o-legacy", `{"order_id":"o-legacy","amount":"12.00","currency":"USD"}`)
	path := "/v1/payment_intents/" + in.ID + "/capture"
	var op opstatus.Operation
	b.agent.Post(path, `{}`, apitest.Key("cap-legacy")).Status(t, http.StatusAccepted).Decode(t, &op)
	b.assertCounters(t, map[string]int64{"authorize": 1})

	// What a process of the earlier release sent for this operation.
	var auth struct {
		ProviderAuthorizationID string `json:"provider_authorization_id"`
	}
	b.agent.Get("/v1/payment_intents/"+in.ID).Status(t, http.StatusOK).Decode(t, &auth)
	if _, err := client.Capture(t.Context(), "rs-"+op.ID, auth.ProviderAuthorizationID, 1200); err != nil {
		t.Fatal(err)
	}

	retry := b.agent.Post(path, `{}`, apitest.Key("cap-legacy")).Status(t, http.StatusOK)
	var captured intent
	retry.Decode(t, &captured)
	if captured.Status != "succeeded" || captured.CapturedMinor != 1200 {
		t.Fatalf("retry = %s; want the capture settled from the provider's record", retry.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	ev, ok := hasEvent(operation(t, b.agent, "cap-legacy"), payments.EventProviderLookup)
	if !ok || !strings.Contains(string(ev.Detail), `"rs-`+op.ID+`"`) {
		t.Fatalf("provider_lookup evidence = %s; want the operation's own key rs-%s", ev.Detail, op.ID)
	}
}
