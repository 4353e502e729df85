package payments_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/services/payments"
)

// loseRows deletes what a failover to an asynchronous standby takes away: the rows of the writes the old primary
// acknowledged last, while the provider keeps what it executed. Their operations stay: the sweep never reads them.
func (b *bundle) loseRows(t *testing.T, statements ...string) {
	t.Helper()
	for _, q := range statements {
		if err := b.db.Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// sweep runs the provider sweep once.
func (b *bundle) sweep(t *testing.T) payments.SweepResult {
	t.Helper()
	res, err := b.svc.SweepProvider(t.Context())
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	return res
}

// assertAllBooks checks every authorization the provider holds for the merchant against our rows: exactly one
// intent names it, with the provider's status, captured and refunded totals, and one refund row per refund paid.
func (b *bundle) assertAllBooks(t *testing.T) {
	t.Helper()
	effects, err := b.provider.Effects(t.Context(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{"authorized": "requires_capture", "captured": "succeeded", "voided": "canceled"}
	refunds := map[string]int64{}
	for _, e := range effects {
		if e.Kind == "refund" {
			refunds[e.AuthorizationID]++
		}
	}
	for _, e := range effects {
		if e.Kind != "authorize" {
			continue
		}
		a := e.Authorization
		var rows []struct {
			Status                       string
			CapturedMinor, RefundedMinor int64
			Refunds                      int64
		}
		err := b.db.Raw(`SELECT status, captured_minor, refunded_minor,
  (SELECT count(*) FROM payment_refunds r WHERE r.account_id = i.account_id AND r.intent_id = i.id AND r.status = 'succeeded') AS refunds
FROM payment_intents i WHERE provider_authorization_id = ?`, a.ID).Scan(&rows).Error
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || rows[0].Status != status[a.Status] || rows[0].CapturedMinor != a.CapturedMinor ||
			rows[0].RefundedMinor != a.RefundedMinor || rows[0].Refunds != refunds[a.ID] {
			t.Errorf("authorization %s (%s, captured %d, refunded %d, %d refunds) is booked as %+v",
				a.ID, a.Status, a.CapturedMinor, a.RefundedMinor, refunds[a.ID], rows)
		}
	}
}

// count runs a count query.
func (b *bundle) count(t *testing.T, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := b.db.Raw(q, args...).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// testSweepRestoresLostRows: four intents at the provider. The rows of a captured and partly refunded one, of an
// authorized one, and the cancel of a third are lost; the fourth is intact. The sweep restores each lost effect
// (authorize, capture, refund, authorize, void: five restore operations, each with its restored event), matches
// the rest, and the books equal the provider's. A second sweep finds nothing to do and adds nothing.
func testSweepRestoresLostRows(t *testing.T, h *harness) {
	b := h.setup(t)
	lost := b.createIntent(t, "o-lost", `{"order_id":"o-lost","amount":"40.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+lost.ID+"/capture", `{"amount":"35.00"}`, apitest.Key("cap-lost")).Status(t, http.StatusOK)
	b.agent.Post("/v1/payment_intents/"+lost.ID+"/refunds", `{"amount":"5.00"}`, apitest.Key("ref-lost")).Status(t, http.StatusCreated)
	authorized := b.createIntent(t, "o-auth", `{"order_id":"o-auth","amount":"12.00","currency":"USD"}`)
	canceled := b.createIntent(t, "o-cancel", `{"order_id":"o-cancel","amount":"8.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+canceled.ID+"/cancel", `{}`, apitest.Key("cancel")).Status(t, http.StatusOK)
	kept := b.createIntent(t, "o-kept", `{"order_id":"o-kept","amount":"9.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+kept.ID+"/capture", `{}`, apitest.Key("cap-kept")).Status(t, http.StatusOK)

	first := b.sweep(t)
	if first.Effects != 8 || first.Matched != 8 || first.Restored != 0 {
		t.Fatalf("sweep of intact books = %+v; want 8 effects, all matched", first)
	}
	b.loseRows(t,
		`DELETE FROM payment_refunds WHERE intent_id = '`+lost.ID+`'`,
		`DELETE FROM payment_intents WHERE id IN ('`+lost.ID+`', '`+authorized.ID+`')`,
		`UPDATE payment_intents SET status = 'requires_capture' WHERE id = '`+canceled.ID+`'`,
		// The lost sweep mark too: the standby never saw it.
		`DELETE FROM payment_provider_sweep`)
	res := b.sweep(t)
	if res.Restored != 5 || res.Matched != 3 || res.Unmatched() != 0 {
		t.Fatalf("sweep after the loss = %+v; want 5 restored, 3 matched, none left", res)
	}
	b.assertAllBooks(t)
	if n := b.count(t, `SELECT count(*) FROM operations o JOIN operation_events e ON e.account_id = o.account_id AND e.operation_id = o.id
WHERE o.kind = ? AND o.state = 'succeeded' AND e.type = ?`, payments.KindRestore, payments.EventRestored); n != 5 {
		t.Errorf("%d succeeded restore operations with their event; want 5", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_intents WHERE order_id = 'o-lost' AND status = 'succeeded' AND captured_minor = 3500 AND refunded_minor = 500`); n != 1 {
		t.Errorf("%d restored o-lost intents captured 35.00 and refunded 5.00; want 1", n)
	}
	b.assertCounters(t, map[string]int64{"authorize": 4, "capture": 2, "void": 1, "refund": 1})

	again := b.sweep(t)
	if again.Restored != 0 || again.ForPerson != 0 {
		t.Fatalf("second sweep = %+v; want nothing restored", again)
	}
	if n := b.count(t, `SELECT count(*) FROM operations WHERE kind = ?`, payments.KindRestore); n != 5 {
		t.Errorf("%d restore operations after a second sweep; want still 5", n)
	}
	b.assertAllBooks(t)
}

// testSweepLeavesATakenOrderToAPerson: a lost intent's order was paid again under another key before the sweep
// (a second authorization): the lost authorization cannot become a second active intent of the order. The sweep
// opens one unknown restore operation for a person, naming the provider's authorization, and a later sweep opens
// no other.
func testSweepLeavesATakenOrderToAPerson(t *testing.T, h *harness) {
	b := h.setup(t)
	first := b.createIntent(t, "o-twice", `{"order_id":"o-twice","amount":"20.00","currency":"USD"}`)
	b.loseRows(t, `DELETE FROM payment_intents WHERE id = '`+first.ID+`'`)
	b.agent.Post("/v1/payment_intents", `{"order_id":"o-twice","amount":"20.00","currency":"USD"}`, apitest.Key("again")).
		Status(t, http.StatusCreated)
	for range 2 {
		res := b.sweep(t)
		if res.ForPerson != 1 || res.Restored != 0 || res.Unmatched() != 1 {
			t.Fatalf("sweep = %+v; want one effect left to a person", res)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM operations WHERE kind = ? AND state = 'unknown' AND resource_type = 'provider_effect'`,
		payments.KindRestore); n != 1 {
		t.Errorf("%d restore operations for a person; want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_intents WHERE order_id = 'o-twice'`); n != 1 {
		t.Errorf("%d intents of the order; want the one of the second authorization", n)
	}
}

// testRetryAdoptsWhatTheSweepRestored: an intent created, captured and partly refunded on a primary whose commits
// all vanished (here: a second database, the same provider merchant). The sweep on the new primary restores the
// three effects; the agent then sends each request again under its key (the capture and refund on the intent the
// create answers now). Each adopts what was restored: the same intent and refund, no new provider call, nothing
// booked twice, and the books equal the provider's.
func testRetryAdoptsWhatTheSweepRestored(t *testing.T, h *harness) {
	old := h.setup(t)
	promoted := h.setup(t)
	const create = `{"order_id":"o-adopt","amount":"30.00","currency":"USD"}`
	first := old.createIntent(t, "o-adopt", create)
	old.agent.Post("/v1/payment_intents/"+first.ID+"/capture", `{}`, apitest.Key("cap-adopt")).Status(t, http.StatusOK)
	old.agent.Post("/v1/payment_intents/"+first.ID+"/refunds", `{"amount":"4.00"}`, apitest.Key("ref-adopt")).Status(t, http.StatusCreated)

	if res := promoted.sweep(t); res.Restored != 3 {
		t.Fatalf("sweep on the new primary = %+v; want the three effects restored", res)
	}
	var in intent
	promoted.agent.Post("/v1/payment_intents", create, apitest.Key("create-o-adopt")).Status(t, http.StatusCreated).Decode(t, &in)
	if in.Status != "succeeded" || in.CapturedMinor != 3000 || in.RefundedMinor != 400 {
		t.Fatalf("create sent again = %+v; want the restored intent, captured 30.00, refunded 4.00", in)
	}
	promoted.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap-adopt")).Status(t, http.StatusOK)
	var rf struct {
		ID string `json:"id"`
	}
	promoted.agent.Post("/v1/payment_intents/"+in.ID+"/refunds", `{"amount":"4.00"}`, apitest.Key("ref-adopt")).
		Status(t, http.StatusCreated).Decode(t, &rf)
	if n := promoted.count(t, `SELECT count(*) FROM payment_refunds WHERE id = ? AND status = 'succeeded'`, rf.ID); n != 1 {
		t.Errorf("the refund sent again answered %s, not the restored refund", rf.ID)
	}
	if n := promoted.count(t, `SELECT count(*) FROM payment_restored_effects WHERE adopted_by IS NOT NULL`); n != 3 {
		t.Errorf("%d restored effects adopted; want 3", n)
	}
	promoted.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})
	promoted.assertAllBooks(t)
	if got := promoted.getIntent(t, in.ID); got.RefundedMinor != 400 || got.CapturedMinor != 3000 {
		t.Errorf("intent after the retries = %+v; want captured 30.00, refunded 4.00 once", got)
	}
}
