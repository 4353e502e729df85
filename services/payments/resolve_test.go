package payments_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// testResolveUnknownCapture: a capture whose call never reaches the provider (held on the way) stays unknown
// with the intent reserved. Once its lease has ended, so that the call can no longer arrive, a person decides it
// failed: the decision is a record with its evidence, the operation is failed, the intent's reservation is
// released, and the books equal the provider's (nothing captured); the same decision again is a replay; an
// agent key, bad evidence and a decision on a settled operation change nothing.
func testResolveUnknownCapture(t *testing.T, h *harness) {
	b := h.setupWith(t, holdProvider(t, h.providerURL, "/capture").URL)
	in := b.createIntent(t, "o-resolve", `{"order_id":"o-resolve","amount":"25.00","currency":"USD"}`)
	var op opstatus.Operation
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap-r")).Status(t, http.StatusAccepted).Decode(t, &op)
	if op.State != opstatus.StateUnknown || b.getIntent(t, in.ID).Status != "capturing" {
		t.Fatalf("operation %s, intent %s; want unknown, capturing", op.State, b.getIntent(t, in.ID).Status)
	}
	path := "/v1/operations/" + op.ID + "/resolution"
	evidence := "Provider dashboard shows no capture for this authorization.\nChecked by <b>ops</b> & \"finance\"."
	body := map[string]any{"state": "failed", "evidence": evidence}

	// Refused before anything is recorded: an agent key, evidence a person would read in another order.
	if got := code(t, b.agent.Post(path, body, apitest.Key("dec-agent")).Status(t, http.StatusForbidden)); got != "forbidden" {
		t.Fatalf("agent key: code %s; want forbidden", got)
	}
	bad := b.approver.Post(path, map[string]any{"state": "failed", "evidence": "refund \u202eylno"}, apitest.Key("dec-bad")).
		Status(t, http.StatusUnprocessableEntity)
	if !strings.Contains(string(bad.Body), `"field":"evidence"`) {
		t.Fatalf("bidi evidence: %s; want a field error naming evidence", bad.Body)
	}
	if got := code(t, b.approver.Post(path, map[string]any{"state": "cancelled", "evidence": "x"}, apitest.Key("dec-bad2")).
		Status(t, http.StatusUnprocessableEntity)); got != "validation_failed" {
		t.Fatalf("state cancelled: code %s", got)
	}
	if got := code(t, b.approver.Post(path, body, apitest.Key("dec-early")).Status(t, http.StatusConflict)); got != "call_may_still_land" {
		t.Fatalf("decision while the lease runs: code %s; want call_may_still_land", got)
	}
	b.endLease(t, op.ID)
	// A capture decided succeeded is refused: the amount taken is the provider's to say.
	if got := code(t, b.approver.Post(path, map[string]any{"state": "succeeded", "evidence": "looks captured"}, apitest.Key("dec-ok")).
		Status(t, http.StatusConflict)); got != "invalid_state" {
		t.Fatalf("capture decided succeeded: code %s; want invalid_state", got)
	}
	if got := b.getIntent(t, in.ID).Status; got != "capturing" {
		t.Fatalf("intent after refused decisions = %q; want capturing", got)
	}
	if got := operation(t, b.agent, "cap-r"); got.State != opstatus.StateUnknown {
		t.Fatalf("after refused decisions the operation is %s; want unknown", got.State)
	}

	first := b.approver.Post(path, body, apitest.Key("dec-1")).Status(t, http.StatusOK)
	var decided opstatus.Operation
	first.Decode(t, &decided)
	ev, ok := hasEvent(decided, opstore.EventOperatorDecision)
	if decided.State != opstatus.StateFailed || !ok || ev.FromState != opstatus.StateUnknown || ev.ToState != opstatus.StateFailed ||
		!strings.HasPrefix(ev.Actor, "approver:") || !strings.Contains(string(ev.Detail), "Checked by \\u003cb\\u003eops") {
		t.Fatalf("decided operation = %s, decision event %+v (detail %s)", decided.State, ev, ev.Detail)
	}
	// The reservation is released: the intent can be captured again.
	if got := b.getIntent(t, in.ID).Status; got != "requires_capture" {
		t.Fatalf("intent after the decision = %q; want requires_capture", got)
	}

	// The same decision again is a replay, byte for byte; a new decision on a settled operation is 409.
	again := b.approver.Post(path, body, apitest.Key("dec-1")).Status(t, http.StatusOK)
	if again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
		t.Fatalf("second decision: replayed %q, body %s", again.Header.Get("Idempotent-Replayed"), again.Body)
	}
	conflict := b.approver.Post(path, map[string]any{"state": "succeeded", "evidence": "changed my mind"}, apitest.Key("dec-2")).
		Status(t, http.StatusConflict)
	if code(t, conflict) != "invalid_state" || conflict.Str(t, "state") != "failed" {
		t.Fatalf("decision on a failed operation: %s; want 409 invalid_state naming failed", conflict.Body)
	}
	// The capture's own key ran and a person settled it: its retry is told so and sent nowhere, never left
	// waiting on a key that no response will ever complete.
	retry := b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap-r")).Status(t, http.StatusConflict)
	if code(t, retry) != "idempotency_response_expired" || retry.Str(t, "state") != "failed" {
		t.Fatalf("retry of the decided capture: %s; want 409 idempotency_response_expired naming failed", retry.Body)
	}
	var tl opstatus.Timeline
	b.agent.Get("/v1/operations/"+op.ID+"/timeline").Status(t, http.StatusOK).Decode(t, &tl)
	decisions := 0
	for _, e := range tl.Entries {
		if e.Type == opstore.EventOperatorDecision && e.Category == "decision" {
			decisions++
		}
	}
	if decisions != 1 || tl.State != opstatus.StateFailed || tl.SettledBy == nil || !strings.HasPrefix(*tl.SettledBy, "approver:") || !tl.Chain.Intact {
		t.Fatalf("timeline: %d decisions, state %s, settled by %v, chain intact %v", decisions, tl.State, tl.SettledBy, tl.Chain.Intact)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})
	b.assertBooks(t, in.ID)
	servicetest.AuditIntact(t, b.db.DB)
}
