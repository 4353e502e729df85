package payments_test

import (
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
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
	go func() { first <- b.agent.Post(capture, `{}`, apitest.Key("cap"), apitest.Header("Attempt-Id", "att_running")) }()
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
  AND detail->>'retry_of' = 'att_running' AND detail->>'outcome' = 'in_progress'`, opID, opstatus.EventRetried).Scan(&n)
	if n != 1 {
		t.Fatalf("%d records of the retry naming the running attempt; want 1", n)
	}
}
