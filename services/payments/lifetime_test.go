package payments_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/provider"
)

// testPrunedKeysNeverRunTwice: a capture and a refund whose stored responses are pruned (what
// IDEMPOTENCY_RETENTION does, once the clock moved past it) are sent again with the same keys: 409
// idempotency_response_expired naming each operation's resource, and nothing more reaches the provider or the
// ledger: one capture, one refund, one refund row, the refunded total unchanged.
func testPrunedKeysNeverRunTwice(t *testing.T, h *harness) {
	b := h.setup(t)
	b.idem.Retention = time.Hour
	in := b.createIntent(t, "o-pruned", `{"order_id":"o-pruned","amount":"20.00","currency":"USD"}`)
	capture := "/v1/payment_intents/" + in.ID + "/capture"
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	b.agent.Post(capture, `{}`, apitest.Key("cap-pruned")).Status(t, http.StatusOK)
	var refund struct {
		ID string `json:"id"`
	}
	b.agent.Post(refunds, `{"amount":"4.00"}`, apitest.Key("ref-pruned")).Status(t, http.StatusCreated).Decode(t, &refund)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})

	b.env.Clock.Advance(time.Hour + time.Minute)
	if responses, _, err := b.idem.Prune(t.Context()); err != nil || responses < 3 {
		t.Fatalf("prune: %d responses, %v; want the create's, the capture's and the refund's", responses, err)
	}
	for _, tc := range []struct{ path, body, key, typ, id string }{
		{capture, `{}`, "cap-pruned", "payment_intent", in.ID},
		{refunds, `{"amount":"4.00"}`, "ref-pruned", "refund", refund.ID},
	} {
		r := b.agent.Post(tc.path, tc.body, apitest.Key(tc.key)).Status(t, http.StatusConflict)
		doc := r.JSON(t)
		resource, _ := doc["resource"].(map[string]any)
		if doc["code"] != "idempotency_response_expired" || doc["state"] != "succeeded" || resource["type"] != tc.typ ||
			resource["id"] != tc.id || r.Header.Get("Retry-After") != "" {
			t.Errorf("%s retried after the prune: %s; want 409 idempotency_response_expired naming %s %s", tc.key, r.Body, tc.typ, tc.id)
		}
		if op := operation(t, b.agent, tc.key); op.State != "succeeded" || op.KeyExpiresAt == nil {
			t.Errorf("%s: operation %+v; want one, succeeded, with its key's expiry", tc.key, op)
		}
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})
	var rows int64
	if err := b.db.Raw(`SELECT count(*) FROM payment_refunds WHERE intent_id = ?`, in.ID).Scan(&rows).Error; err != nil || rows != 1 {
		t.Errorf("refund rows = %d (%v); want 1", rows, err)
	}
	if got := b.getIntent(t, in.ID); got.CapturedMinor != 2000 || got.RefundedMinor != 400 {
		t.Errorf("intent after the retries: captured %d refunded %d; want 2000 and 400", got.CapturedMinor, got.RefundedMinor)
	}
}

// testKeyReusedAfterLifetime: a refund under key K, then K's lifetime ends (keys pruned) and K is sent again
// with the same refund: a new action, so a new provider call under a new provider key, and a second refund at
// the provider with its own id. A same-key retry within the lifetime of a refund whose answer was lost still
// names the first provider call (the reconciler finds it) and refunds nothing more. At the end the provider's
// refunds, per intent, equal the intent's.
func testKeyReusedAfterLifetime(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-reused", `{"order_id":"o-reused","amount":"20.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap-reused")).Status(t, http.StatusOK)
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	type refund struct {
		ID               string `json:"id"`
		ProviderRefundID string `json:"provider_refund_id"`
	}
	var first, second refund
	b.idem.Retention, b.idem.KeyLifetime = time.Hour, time.Hour
	b.agent.Post(refunds, `{"amount":"1.00"}`, apitest.Key("ref-k")).Status(t, http.StatusCreated).Decode(t, &first)
	firstOp := operation(t, b.agent, "ref-k")
	b.env.Clock.Advance(time.Hour + time.Minute)
	if _, keys, err := b.idem.Prune(t.Context()); err != nil || keys < 1 {
		t.Fatalf("prune: %d keys, %v; want the refund's key given up", keys, err)
	}
	b.idem.Retention, b.idem.KeyLifetime = 0, 0
	again := b.agent.Post(refunds, `{"amount":"1.00"}`, apitest.Key("ref-k")).Status(t, http.StatusCreated)
	again.Decode(t, &second)
	if second.ID == first.ID || second.ProviderRefundID == first.ProviderRefundID || again.Header.Get("Idempotent-Replayed") == "true" {
		t.Errorf("the key sent after its lifetime: refund %+v after %+v; want a new refund with its own provider refund", second, first)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 2})
	if got := b.getIntent(t, in.ID); got.RefundedMinor != 200 {
		t.Errorf("intent refunded %d; want 200, the two refunds the provider made", got.RefundedMinor)
	}
	var againOp opstatus.Operation
	b.agent.Get("/v1/operations/"+again.Header.Get("Operation-Id")).Status(t, http.StatusOK).Decode(t, &againOp)
	if k1, k2 := downstreamKeyOf(t, firstOp), downstreamKeyOf(t, againOp); k1 == "" || k1 == k2 {
		t.Errorf("provider keys %q and %q; want a new one for the new action", k1, k2)
	}

	// Within its lifetime the same key names the same provider call.
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindRefund, Mode: provider.FaultDrop, Count: 1}); err != nil {
		t.Fatal(err)
	}
	b.agent.Post(refunds, `{"amount":"2.00"}`, apitest.Key("ref-lost")).Status(t, http.StatusAccepted)
	b.agent.Post(refunds, `{"amount":"2.00"}`, apitest.Key("ref-lost")).Status(t, http.StatusCreated)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 3})
	if got := b.getIntent(t, in.ID); got.RefundedMinor != 400 {
		t.Errorf("intent refunded %d; want 400", got.RefundedMinor)
	}
	b.assertBooks(t, in.ID)
}

// downstreamKeyOf reads the provider key of the operation's first dispatch record.
func downstreamKeyOf(t *testing.T, op opstatus.Operation) string {
	t.Helper()
	ev, ok := hasEvent(op, opstore.EventDispatchStarted)
	if !ok {
		t.Fatalf("operation %s has no dispatch record", op.ID)
	}
	var d struct {
		DownstreamKey string `json:"downstream_key"`
	}
	if err := json.Unmarshal(ev.Detail, &d); err != nil {
		t.Fatal(err)
	}
	return d.DownstreamKey
}
