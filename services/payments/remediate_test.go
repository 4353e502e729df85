package payments_test

import (
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// testRemediation: the provider executes one refund of 3.00 twice and loses the answer, so the refund ends
// duplicate_effect_confirmed. It is booked as the provider executed it: the refund succeeded with two
// executions, the intent's refunded total 6.00, what is left to refund 4.00, equal to the provider's records. A
// refund naming it in Remediates-Operation-Id would pay the customer a third time: it is 409
// duplicate_refund_not_refundable, sends nothing and leaves no row or operation. A header naming an operation
// that is no duplicate, or malformed, is refused before anything is sent.
func testRemediation(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-fix", `{"order_id":"o-fix","amount":"10.00","currency":"USD"}`)
	capture := b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap")).Status(t, http.StatusOK)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindRefund, Mode: provider.FaultDuplicate, Count: 1}); err != nil {
		t.Fatal(err)
	}
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	b.agent.Post(refunds, `{"amount":"3.00"}`, apitest.Key("ref-dup")).Status(t, http.StatusAccepted)
	if _, err := b.recovery.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	dup := operation(t, b.agent, "ref-dup")
	if dup.State != opstatus.StateDuplicateEffect {
		t.Fatalf("duplicated refund is %s", dup.State)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 2})
	var booked struct {
		Status           string `json:"status"`
		Executions       int    `json:"executions"`
		ProviderRefundID string `json:"provider_refund_id"`
	}
	if dup.Resource == nil || dup.Resource.Type != "refund" {
		t.Fatalf("duplicated refund names resource %+v; want its refund", dup.Resource)
	}
	b.agent.Get("/v1/refunds/"+dup.Resource.ID).Status(t, http.StatusOK).Decode(t, &booked)
	if booked.Status != "succeeded" || booked.Executions != 2 || booked.ProviderRefundID == "" {
		t.Errorf("duplicated refund booked as %+v; want succeeded, 2 executions", booked)
	}
	if got := b.getIntent(t, in.ID); got.RefundedMinor != 600 {
		t.Errorf("intent refunded %d after a refund of 3.00 paid out twice; want 600", got.RefundedMinor)
	}
	b.assertBooks(t, in.ID)

	// Another refund is no correction of it.
	fix := apitest.Header(payments.HeaderRemediates, dup.ID)
	r := b.agent.Post(refunds, `{"amount":"3.00","reason":"duplicate refund"}`, fix, apitest.Key("fix")).Status(t, http.StatusConflict)
	if code(t, r) != "duplicate_refund_not_refundable" || r.Str(t, "operation_id") != dup.ID {
		t.Errorf("refund correcting a duplicated refund: %s; want 409 duplicate_refund_not_refundable", r.Body)
	}
	var ops struct {
		Items []opstatus.Operation `json:"items"`
	}
	b.agent.Get("/v1/operations?idempotency_key=fix").Status(t, http.StatusOK).Decode(t, &ops)
	if len(ops.Items) != 0 {
		t.Errorf("the refused correction left operations %+v", ops.Items)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 2})

	// What is left to refund is what the provider has left: 4.00.
	r = b.agent.Post(refunds, `{"amount":"4.01"}`, apitest.Key("beyond")).Status(t, http.StatusUnprocessableEntity)
	if code(t, r) != "amount_too_large" || r.JSON(t)["available_minor"] != float64(400) {
		t.Errorf("refund beyond what the provider has left: %s", r.Body)
	}
	b.agent.Post(refunds, `{"amount":"4.00"}`, apitest.Key("rest")).Status(t, http.StatusCreated)
	var rows int64
	if err := b.db.Raw(`SELECT count(*) FROM payment_refunds WHERE intent_id = ?`, in.ID).Scan(&rows).Error; err != nil || rows != 2 {
		t.Errorf("refund rows = %d (%v); want 2: the duplicated one and the rest", rows, err)
	}

	// Refusals before anything is sent.
	captureOp := capture.Header.Get("Operation-Id")
	r = b.agent.Post(refunds, `{"amount":"1.00"}`, apitest.Header(payments.HeaderRemediates, captureOp), apitest.Key("not-dup")).Status(t, http.StatusConflict)
	if code(t, r) != "invalid_state" || r.Str(t, "state") != "succeeded" {
		t.Errorf("correction of a succeeded capture: %s", r.Body)
	}
	r = b.agent.Post(refunds, `{"amount":"1.00"}`, apitest.Header(payments.HeaderRemediates, "re_1"), apitest.Key("bad")).Status(t, http.StatusBadRequest)
	if r.Str(t, "header") != payments.HeaderRemediates {
		t.Errorf("malformed header: %s", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 3})
	if got := b.getIntent(t, in.ID); got.RefundedMinor != 1000 {
		t.Errorf("intent refunded %d; want 1000, all the provider paid out", got.RefundedMinor)
	}
	b.assertBooks(t, in.ID)
}

// testCaptureCorrectedUntilReturned: a capture of 10.00 the provider executed twice is corrected in parts: 1.00,
// then two corrections of 9.00 race under two keys, one 201 and the other 409 already_remediated (all is
// returned). A correction beyond what is left is 422 amount_too_large, one after all is returned 409
// already_remediated, one naming the duplicate on another intent 400; none sends anything. The provider refunded
// exactly the duplicate, and the books equal it.
func testCaptureCorrectedUntilReturned(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-parts", `{"order_id":"o-parts","amount":"10.00","currency":"USD"}`)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDuplicate, Count: 1}); err != nil {
		t.Fatal(err)
	}
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap-dup")).Status(t, http.StatusAccepted)
	if _, err := b.recovery.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	dup := operation(t, b.agent, "cap-dup")
	if dup.State != opstatus.StateDuplicateEffect {
		t.Fatalf("duplicated capture is %s", dup.State)
	}
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	fix := apitest.Header(payments.HeaderRemediates, dup.ID)
	first := b.agent.Post(refunds, `{"amount":"1.00"}`, fix, apitest.Key("fix-part")).Status(t, http.StatusCreated)
	r := b.agent.Post(refunds, `{"amount":"9.01"}`, fix, apitest.Key("fix-big")).Status(t, http.StatusUnprocessableEntity)
	if code(t, r) != "amount_too_large" || r.JSON(t)["available_minor"] != float64(900) {
		t.Errorf("correction beyond what is left of the duplicate: %s", r.Body)
	}

	res := race(2, func(i int) *apitest.Response {
		return b.agent.Post(refunds, `{"amount":"9.00"}`, fix, apitest.Key([]string{"fix-1", "fix-2"}[i]))
	})
	var won, lost *apitest.Response
	wonKey := "fix-1"
	switch {
	case res[0].Code == http.StatusCreated && res[1].Code == http.StatusConflict:
		won, lost = res[0], res[1]
	case res[1].Code == http.StatusCreated && res[0].Code == http.StatusConflict:
		won, lost, wonKey = res[1], res[0], "fix-2"
	default:
		t.Fatalf("two corrections of the rest: %d %s / %d %s; want one 201 and one 409", res[0].Code, res[0].Body, res[1].Code, res[1].Body)
	}
	if code(t, lost) != "already_remediated" || lost.Str(t, "remediated_by") != first.Header.Get("Operation-Id") {
		t.Errorf("the losing correction: %s; want already_remediated naming the first", lost.Body)
	}
	if r := b.agent.Post(refunds, `{"amount":"0.01"}`, fix, apitest.Key("fix-more")).Status(t, http.StatusConflict); code(t, r) != "already_remediated" {
		t.Errorf("a correction after all is returned: %s", r.Body)
	}
	replay := b.agent.Post(refunds, `{"amount":"9.00"}`, fix, apitest.Key(wonKey)).Status(t, http.StatusCreated)
	if replay.Header.Get("Idempotent-Replayed") != "true" || replay.Header.Get("Operation-Id") != won.Header.Get("Operation-Id") {
		t.Errorf("replay of the winning correction: %v %s", replay.Header, replay.Body)
	}
	other := b.createIntent(t, "o-other", `{"order_id":"o-other","amount":"10.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+other.ID+"/capture", `{}`, apitest.Key("cap-other")).Status(t, http.StatusOK)
	r = b.agent.Post("/v1/payment_intents/"+other.ID+"/refunds", `{"amount":"1.00"}`, fix, apitest.Key("other-intent")).Status(t, http.StatusBadRequest)
	if r.Str(t, "header") != payments.HeaderRemediates {
		t.Errorf("duplicate of another intent: %s", r.Body)
	}

	b.assertCounters(t, map[string]int64{"authorize": 2, "capture": 3, "refund": 2})
	var got struct {
		DuplicateCapturedMinor int64 `json:"duplicate_captured_minor"`
		DuplicateRefundedMinor int64 `json:"duplicate_refunded_minor"`
		RefundedMinor          int64 `json:"refunded_minor"`
	}
	b.agent.Get("/v1/payment_intents/"+in.ID).Status(t, http.StatusOK).Decode(t, &got)
	if got.DuplicateCapturedMinor != 1000 || got.DuplicateRefundedMinor != 1000 || got.RefundedMinor != 0 {
		t.Errorf("intent after the corrections %+v; want the whole duplicate of 10.00 returned", got)
	}
	var dupTL opstatus.Timeline
	b.agent.Get("/v1/operations/"+dup.ID+"/timeline").Status(t, http.StatusOK).Decode(t, &dupTL)
	if len(dupTL.RemediatedBy) != 2 || !dupTL.Chain.Intact {
		t.Errorf("the capture's timeline: remediated_by %v; want both corrections", dupTL.RemediatedBy)
	}
	b.assertBooks(t, in.ID)
	b.assertBooks(t, other.ID)
}

// testCaptureDuplicateCorrected: the provider executes one capture twice (it took 10.00 twice from a 10.00
// authorization) and loses the answer; the capture ends duplicate_effect_confirmed and the intent stays
// reserved. The correction, a refund of 10.00 naming the capture, records the capture as the provider executed
// it (captured 10.00, duplicate_captured 10.00) and returns the duplicate: one refund at the provider, counted in
// duplicate_refunded, so the customer's own refunds still have the whole 10.00 capture, and no more: refunds
// never exceed what was really captured (20.00), at the provider or in the ledger. More than the duplicate took
// is refused before anything is sent, and so is a second correction.
func testCaptureDuplicateCorrected(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-dupcap", `{"order_id":"o-dupcap","amount":"10.00","currency":"USD"}`)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDuplicate, Count: 1}); err != nil {
		t.Fatal(err)
	}
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap-dup")).Status(t, http.StatusAccepted)
	if _, err := b.recovery.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	dup := operation(t, b.agent, "cap-dup")
	if dup.State != opstatus.StateDuplicateEffect {
		t.Fatalf("duplicated capture is %s", dup.State)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 2})
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	// Reserved by the duplicate: no refund of the capture yet.
	if r := b.agent.Post(refunds, `{"amount":"1.00"}`, apitest.Key("early")).Status(t, http.StatusConflict); code(t, r) != "invalid_state" {
		t.Errorf("refund before the correction: %s", r.Body)
	}

	fix := apitest.Header(payments.HeaderRemediates, dup.ID)
	r := b.agent.Post(refunds, `{"amount":"10.01"}`, fix, apitest.Key("fix-big")).Status(t, http.StatusUnprocessableEntity)
	if code(t, r) != "amount_too_large" || r.JSON(t)["available_minor"] != float64(1000) {
		t.Errorf("correction above the duplicate: %s", r.Body)
	}
	var correction struct {
		ID                      string `json:"id"`
		Status                  string `json:"status"`
		ReturnsDuplicateCapture bool   `json:"returns_duplicate_capture"`
	}
	done := b.agent.Post(refunds, `{"amount":"10.00","reason":"duplicate capture"}`, fix, apitest.Key("fix")).Status(t, http.StatusCreated)
	done.Decode(t, &correction)
	if correction.Status != "succeeded" || !correction.ReturnsDuplicateCapture {
		t.Fatalf("correction %s; want a succeeded refund returning the duplicated capture", done.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 2, "refund": 1})
	var got struct {
		intent
		DuplicateCaptureOperationID string `json:"duplicate_capture_operation_id"`
		DuplicateCapturedMinor      int64  `json:"duplicate_captured_minor"`
		DuplicateRefundedMinor      int64  `json:"duplicate_refunded_minor"`
	}
	b.agent.Get("/v1/payment_intents/"+in.ID).Status(t, http.StatusOK).Decode(t, &got)
	if got.Status != "succeeded" || got.CapturedMinor != 1000 || got.RefundedMinor != 0 || got.DuplicateCapturedMinor != 1000 ||
		got.DuplicateRefundedMinor != 1000 || got.DuplicateCaptureOperationID != dup.ID {
		t.Errorf("intent after the correction %+v; want captured 10.00, duplicate 10.00 returned, nothing of the capture refunded", got)
	}
	r = b.agent.Post(refunds, `{"amount":"1.00"}`, fix, apitest.Key("fix-again")).Status(t, http.StatusConflict)
	if code(t, r) != "already_remediated" || r.Str(t, "remediated_by") != done.Header.Get("Operation-Id") {
		t.Errorf("second correction: %s", r.Body)
	}

	// The customer's own refunds have the whole capture, and not a cent more.
	b.agent.Post(refunds, `{"amount":"10.00"}`, apitest.Key("customer")).Status(t, http.StatusCreated)
	r = b.agent.Post(refunds, `{"amount":"0.01"}`, apitest.Key("beyond")).Status(t, http.StatusUnprocessableEntity)
	if code(t, r) != "amount_too_large" {
		t.Errorf("a refund beyond what was really captured: %s", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 2, "refund": 2})
	var sum int64
	if err := b.db.Raw(`SELECT COALESCE(sum(amount_minor), 0) FROM payment_refunds WHERE intent_id = ? AND status = 'succeeded'`, in.ID).
		Scan(&sum).Error; err != nil || sum != 2000 {
		t.Errorf("refunded in all %d (%v); want 2000: what the provider really captured", sum, err)
	}
	var dupTL opstatus.Timeline
	b.agent.Get("/v1/operations/"+dup.ID+"/timeline").Status(t, http.StatusOK).Decode(t, &dupTL)
	if len(dupTL.RemediatedBy) != 1 || dupTL.RemediatedBy[0] != done.Header.Get("Operation-Id") {
		t.Errorf("the capture's timeline: remediated_by %v", dupTL.RemediatedBy)
	}
	b.assertBooks(t, in.ID)
}
