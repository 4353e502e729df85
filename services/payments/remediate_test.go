package payments_test

import (
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// testRemediation: the provider executes one refund twice and loses the answer, so the refund ends
// duplicate_effect_confirmed. Two corrections naming it in Remediates-Operation-Id race under two keys: one
// refunds the duplicate amount at the provider, the other is 409 already_remediated naming it, and sends
// nothing. A replay of the correction's key replays it. Both timelines show the link. A header naming an
// operation that is no duplicate, or a duplicate of another intent, is refused before anything is sent.
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

	fix := apitest.Header(payments.HeaderRemediates, dup.ID)
	// More than the duplicate took is no correction.
	r := b.agent.Post(refunds, `{"amount":"3.01"}`, fix, apitest.Key("too-much")).Status(t, http.StatusUnprocessableEntity)
	if code(t, r) != "amount_too_large" || r.JSON(t)["available_minor"] != float64(300) {
		t.Errorf("correction above the duplicate: %s", r.Body)
	}
	res := race(2, func(i int) *apitest.Response {
		return b.agent.Post(refunds, `{"amount":"3.00","reason":"duplicate refund"}`, fix, apitest.Key([]string{"fix-1", "fix-2"}[i]))
	})
	var won *apitest.Response
	wonKey, lostKey := "fix-1", "fix-2"
	switch {
	case res[0].Code == http.StatusCreated && res[1].Code == http.StatusConflict:
		won = res[0]
	case res[1].Code == http.StatusCreated && res[0].Code == http.StatusConflict:
		won, wonKey, lostKey = res[1], "fix-2", "fix-1"
		res[0], res[1] = res[1], res[0]
	default:
		t.Fatalf("two corrections: %d %s / %d %s; want one 201 and one 409", res[0].Code, res[0].Body, res[1].Code, res[1].Body)
	}
	fixOp := won.Header.Get(idem.HeaderOperationID)
	if code(t, res[1]) != "already_remediated" || res[1].Str(t, "remediated_by") != fixOp || res[1].Str(t, "operation_id") != dup.ID {
		t.Errorf("second correction: %s; want already_remediated naming %s", res[1].Body, fixOp)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 3})
	r = b.agent.Post(refunds, `{"amount":"5.00"}`, fix, apitest.Key("fix-3")).Status(t, http.StatusConflict)
	if code(t, r) != "already_remediated" {
		t.Errorf("a later, larger correction: %s; want already_remediated", r.Body)
	}

	// The correction's key replays; the refused one left its key free and no row behind.
	replay := b.agent.Post(refunds, `{"amount":"3.00","reason":"duplicate refund"}`, fix, apitest.Key(wonKey)).Status(t, http.StatusCreated)
	if replay.Header.Get(idem.HeaderReplayed) != "true" || replay.Header.Get(idem.HeaderOperationID) != fixOp {
		t.Errorf("replay of the correction: %v %s", replay.Header, replay.Body)
	}
	b.agent.Post(refunds, `{"amount":"3.00","reason":"duplicate refund"}`, fix, apitest.Key(lostKey)).Status(t, http.StatusConflict)
	var ops struct {
		Items []opstatus.Operation `json:"items"`
	}
	b.agent.Get("/v1/operations?idempotency_key="+lostKey).Status(t, http.StatusOK).Decode(t, &ops)
	if len(ops.Items) != 0 {
		t.Errorf("the refused correction left operations %+v", ops.Items)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 3})
	var rows int64
	if err := b.db.Raw(`SELECT count(*) FROM payment_refunds WHERE intent_id = ?`, in.ID).Scan(&rows).Error; err != nil || rows != 2 {
		t.Errorf("refund rows = %d (%v); want 2: the duplicated one and its correction", rows, err)
	}

	var dupTL, fixTL opstatus.Timeline
	b.agent.Get("/v1/operations/"+dup.ID+"/timeline").Status(t, http.StatusOK).Decode(t, &dupTL)
	b.agent.Get("/v1/operations/"+fixOp+"/timeline").Status(t, http.StatusOK).Decode(t, &fixTL)
	if len(dupTL.RemediatedBy) != 1 || dupTL.RemediatedBy[0] != fixOp || dupTL.Remediates != nil {
		t.Errorf("duplicate's timeline: remediated_by %v remediates %v; want [%s]", dupTL.RemediatedBy, dupTL.Remediates, fixOp)
	}
	if fixTL.Remediates == nil || *fixTL.Remediates != dup.ID || len(fixTL.RemediatedBy) != 0 {
		t.Errorf("correction's timeline: remediates %v", fixTL.Remediates)
	}
	if !dupTL.Chain.Intact || !fixTL.Chain.Intact {
		t.Errorf("chains %+v %+v", dupTL.Chain, fixTL.Chain)
	}

	// Refusals before anything is sent.
	captureOp := capture.Header.Get(idem.HeaderOperationID)
	r = b.agent.Post(refunds, `{"amount":"1.00"}`, apitest.Header(payments.HeaderRemediates, captureOp), apitest.Key("not-dup")).Status(t, http.StatusConflict)
	if code(t, r) != "invalid_state" || r.Str(t, "state") != "succeeded" {
		t.Errorf("correction of a succeeded capture: %s", r.Body)
	}
	r = b.agent.Post(refunds, `{"amount":"1.00"}`, apitest.Header(payments.HeaderRemediates, "re_1"), apitest.Key("bad")).Status(t, http.StatusBadRequest)
	if r.Str(t, "header") != payments.HeaderRemediates {
		t.Errorf("malformed header: %s", r.Body)
	}
	other := b.createIntent(t, "o-other", `{"order_id":"o-other","amount":"10.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+other.ID+"/capture", `{}`, apitest.Key("cap-other")).Status(t, http.StatusOK)
	r = b.agent.Post("/v1/payment_intents/"+other.ID+"/refunds", `{"amount":"1.00"}`, apitest.Header(payments.HeaderRemediates, dup.ID),
		apitest.Key("other-intent")).Status(t, http.StatusBadRequest)
	if r.Str(t, "header") != payments.HeaderRemediates {
		t.Errorf("duplicate of another intent: %s", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 2, "capture": 2, "refund": 3})
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
	if code(t, r) != "already_remediated" || r.Str(t, "remediated_by") != done.Header.Get(idem.HeaderOperationID) {
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
	if len(dupTL.RemediatedBy) != 1 || dupTL.RemediatedBy[0] != done.Header.Get(idem.HeaderOperationID) {
		t.Errorf("the capture's timeline: remediated_by %v", dupTL.RemediatedBy)
	}
}
