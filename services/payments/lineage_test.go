package payments_test

import (
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// testRetryOfRunningCapture: a capture whose provider call is slow is still running when a retry with its key
// names it in Retry-Of. A running attempt is a valid parent: the retry is answered 409 request_in_progress, as
// one without the header is, and recorded naming it; the capture ends once, and a later retry replays it.
func testRetryOfRunningCapture(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-slow", `{"order_id":"o-slow","amount":"10.00","currency":"USD"}`)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDelay, Count: 1, DelayMS: 1500}); err != nil {
		t.Fatal(err)
	}
	capture := "/v1/payment_intents/" + in.ID + "/capture"
	first := make(chan *apitest.Response, 1)
	go func() {
		first <- b.agent.Post(capture, `{}`, apitest.Key("cap"), apitest.Header("Attempt-Id", "att_running"))
	}()
	servicetest.Eventually(t, "the provider executes the capture and holds its answer", func() bool {
		got, err := b.provider.Counters(t.Context())
		return err == nil && got["capture"] == 1
	})
	retry := b.agent.Post(capture, `{}`, apitest.Key("cap"), apitest.Header("Attempt-Id", "att_retry"),
		apitest.Header("Retry-Of", "att_running"), apitest.Header("Retry-Reason", "response_lost_after_dispatch")).Status(t, http.StatusConflict)
	if code(t, retry) != "request_in_progress" {
		t.Fatalf("retry of the running attempt: %s; want request_in_progress", retry.Body)
	}
	done := (<-first).Status(t, http.StatusOK)
	opID := done.Header.Get("Operation-Id")
	b.agent.Post(capture, `{}`, apitest.Key("cap"), apitest.Header("Attempt-Id", "att_later"),
		apitest.Header("Retry-Of", "att_retry")).Status(t, http.StatusOK)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	if got := b.getIntent(t, in.ID); got.CapturedMinor != 1000 {
		t.Fatalf("intent captured %d; want 1000", got.CapturedMinor)
	}
	var n int64
	b.db.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = ? AND detail->>'attempt_id' = 'att_retry'
  AND detail->>'retry_of' = 'att_running' AND detail->>'outcome' = 'in_progress'`, opID, opstore.EventRetried).Scan(&n)
	if n != 1 {
		t.Fatalf("%d records of the retry naming the running attempt; want 1", n)
	}
}

// testHeadersThatCannotApply: a capture below the approval threshold needs no approval, yet an Approval-Id sent
// with it is checked, never ignored: one no approval can be ("garbage") or of another request is 403
// approval_invalid, and nothing is claimed or sent. A capture corrects no operation: Remediates-Operation-Id is
// 400 naming it. An approval of exactly this request applies and is used.
func testHeadersThatCannotApply(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-hdr", `{"order_id":"o-hdr","amount":"10.00","currency":"USD"}`)
	capture := "/v1/payment_intents/" + in.ID + "/capture"
	other := b.approval(t, capture, "cap-other", `{}`)
	for name, opt := range map[string]apitest.Option{
		"garbage":       apitest.Header("Approval-Id", "garbage"),
		"another key's": other,
	} {
		r := b.agent.Post(capture, `{}`, apitest.Key("cap"), opt).Status(t, http.StatusForbidden)
		if code(t, r) != "approval_invalid" {
			t.Errorf("%s approval: %s; want approval_invalid", name, r.Body)
		}
	}
	r := b.agent.Post(capture, `{}`, apitest.Key("cap"), apitest.Header("Remediates-Operation-Id", "op_01a24f00-e473-7db3-9fb3-ebbcc5b1ae6b")).
		Status(t, http.StatusBadRequest)
	if code(t, r) != "invalid_request" || r.Str(t, "header") != "Remediates-Operation-Id" {
		t.Errorf("Remediates-Operation-Id on a capture: %s; want 400 naming it", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})
	var ops int64
	b.db.Raw(`SELECT count(*) FROM operations WHERE kind = ?`, payments.KindCapture).Scan(&ops)
	if ops != 0 {
		t.Fatalf("%d capture operations after refusals; want none", ops)
	}
	if got := b.getIntent(t, in.ID); got.CapturedMinor != 0 || got.Status != "requires_capture" {
		t.Fatalf("intent after refusals: %+v; want it untouched", got)
	}

	b.agent.Post(capture, `{}`, apitest.Key("cap"), b.approval(t, capture, "cap", `{}`)).Status(t, http.StatusOK)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	var used int64
	b.db.Raw(`SELECT count(*) FROM approvals WHERE idempotency_key = 'cap' AND used_by_operation_id IS NOT NULL`).Scan(&used)
	if used != 1 {
		t.Fatalf("the approval of the capture is used by %d operations; want 1", used)
	}
}
