package payments_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
)

// testPrunedKeysNeverRunTwice: a capture and a refund whose stored responses are pruned (what
// IDEMPOTENCY_RETENTION does, here a microsecond) are sent again with the same keys: 409
// idempotency_response_expired naming each operation's resource, and nothing more reaches the provider or the
// ledger: one capture, one refund, one refund row, the refunded total unchanged.
func testPrunedKeysNeverRunTwice(t *testing.T, h *harness) {
	b := h.setup(t)
	b.idem.Retention = time.Microsecond
	in := b.createIntent(t, "o-pruned", `{"order_id":"o-pruned","amount":"20.00","currency":"USD"}`)
	capture := "/v1/payment_intents/" + in.ID + "/capture"
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	b.agent.Post(capture, `{}`, apitest.Key("cap-pruned")).Status(t, http.StatusOK)
	var refund struct {
		ID string `json:"id"`
	}
	b.agent.Post(refunds, `{"amount":"4.00"}`, apitest.Key("ref-pruned")).Status(t, http.StatusCreated).Decode(t, &refund)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})

	time.Sleep(2 * time.Millisecond)
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
