package payments_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/provider"
)

// testSupersedeUnknownWithApproval: a refund whose answer the provider lost is unknown. A smaller refund that
// supersedes it is refused 409 superseded_operation_unknown and sends nothing, with no approval, with one that
// is pending, and with an approved one that does not name the unknown refund. An approval of the exact request
// naming it shows the approver the prior operation, its state, its last dispatch and reason; approved, the
// replacement runs once: two refunds at the provider, the link on the unknown refund, the approval used.
func testSupersedeUnknownWithApproval(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-sup", `{"order_id":"o-sup","amount":"10.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap")).Status(t, http.StatusOK)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindRefund, Mode: provider.FaultDrop, Count: 1}); err != nil {
		t.Fatal(err)
	}
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	b.agent.Post(refunds, `{"amount":"3.00"}`, apitest.Key("ref-lost")).Status(t, http.StatusAccepted)
	old := operation(t, b.agent, "ref-lost")
	if old.State != opstatus.StateUnknown {
		t.Fatalf("lost refund is %s; want unknown", old.State)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})

	const body = `{"amount":"2.00"}`
	sup := apitest.Header(idem.HeaderSupersedes, old.ID)
	r := b.agent.Post(refunds, body, sup, apitest.Key("ref-new")).Status(t, http.StatusConflict)
	if code(t, r) != "superseded_operation_unknown" || r.Str(t, "operation_id") != old.ID {
		t.Fatalf("without an approval: %s", r.Body)
	}
	ask := func(key string, supersedes string) map[string]any {
		req := map[string]any{"method": "POST", "path": refunds, "idempotency_key": "ref-new", "body": json.RawMessage(body)}
		if supersedes != "" {
			req["supersedes_operation_id"] = supersedes
		}
		raw, _ := json.Marshal(req)
		return b.agent.Post("/v1/approvals", string(raw), apitest.Key(key)).Status(t, http.StatusCreated).JSON(t)
	}
	plain := ask("apv-plain", "")["id"].(string)
	b.approver.Post("/v1/approvals/"+plain+"/approve", `{}`).Status(t, http.StatusOK)
	card := ask("apv-sup", old.ID)
	named := card["id"].(string)
	prior, _ := card["summary"].(map[string]any)["supersedes"].(map[string]any)
	if prior["operation_id"] != old.ID || prior["state"] != "unknown" || prior["dispatch_state"] != "sent_no_response" ||
		prior["reason"] == nil || prior["reason"] == "none" || prior["kind"] != "payments.refund" {
		t.Errorf("the approval card says of the prior operation %v; want its id, kind, state unknown, last dispatch and reason", prior)
	}
	for name, id := range map[string]string{"pending": named, "not naming it": plain} {
		r := b.agent.Post(refunds, body, sup, apitest.Key("ref-new"), apitest.Header("Approval-Id", id)).Status(t, http.StatusForbidden)
		if code(t, r) != "approval_invalid" {
			t.Errorf("%s: %s; want approval_invalid", name, r.Body)
		}
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})

	b.approver.Post("/v1/approvals/"+named+"/approve", `{}`).Status(t, http.StatusOK)
	// The approval is of a request that supersedes: sent without the header it cannot apply, and is refused.
	r = b.agent.Post(refunds, body, apitest.Key("ref-other"), apitest.Header("Approval-Id", named)).Status(t, http.StatusForbidden)
	if code(t, r) != "approval_invalid" {
		t.Fatalf("the approval without the Supersedes-Operation-Id it names: %s; want approval_invalid", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})
	var n int64
	b.db.Raw(`SELECT count(*) FROM approvals WHERE id = ? AND used_by_operation_id IS NOT NULL`, named).Scan(&n)
	if n != 0 {
		t.Fatalf("the approval was used by a request that supersedes nothing")
	}
	done := b.agent.Post(refunds, body, sup, apitest.Key("ref-new"), apitest.Header("Approval-Id", named)).Status(t, http.StatusCreated)
	newOp := done.Header.Get("Operation-Id")
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 2})
	b.db.Raw(`SELECT count(*) FROM approvals WHERE id = ? AND used_by_operation_id = ?`, named, newOp).Scan(&n)
	if n != 1 {
		t.Errorf("the approval is not marked used by %s", newOp)
	}
	b.db.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = 'superseded' AND detail->>'superseded_by' = ?`, old.ID, newOp).Scan(&n)
	if n != 1 {
		t.Errorf("the unknown refund records %d links to its replacement; want 1", n)
	}
	b.db.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = 'approval_checked' AND detail->>'supersedes_operation_id' = ?`, newOp, old.ID).Scan(&n)
	if n != 1 {
		t.Errorf("the replacement records %d approval checks naming the prior operation; want 1", n)
	}
	// A replay needs no approval again, and runs nothing.
	b.agent.Post(refunds, body, sup, apitest.Key("ref-new")).Status(t, http.StatusCreated)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 2})
}
