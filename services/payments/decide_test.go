package payments_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/provider"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// heldProvider is a proxy in front of the provider that holds every request whose path ends in suffix until
// release is closed, then sends it on, whoever still waits for its answer: a provider that was stopped and
// resumes, or a network that delivers late. done is closed once the held request reached the provider. A
// request still held when the test ends never reaches it.
type heldProvider struct {
	URL                 string
	release, done, gone chan struct{}
}

// endLease moves the lease of operation id into the past, as the clock would once it ran out.
func (b *bundle) endLease(t *testing.T, id string) {
	t.Helper()
	if err := b.db.Exec(`UPDATE operations SET lease_expires_at = now() - interval '1 second' WHERE id = ?`, id).Error; err != nil {
		t.Fatal(err)
	}
}

func holdProvider(t *testing.T, target, suffix string) *heldProvider {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	h := &heldProvider{release: make(chan struct{}), done: make(chan struct{}), gone: make(chan struct{})}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, suffix) {
			proxy.ServeHTTP(w, r)
			return
		}
		select {
		case <-h.release:
		case <-h.gone:
			http.Error(w, "the test is over", http.StatusServiceUnavailable)
			return
		}
		defer close(h.done)
		// The caller gave up long ago; the request still arrives. ReverseProxy cancels the forwarded call when
		// the client's connection closes (http.CloseNotifier) if the request's context cannot be cancelled, so
		// it gets a writer without CloseNotify.
		proxy.ServeHTTP(struct{ http.ResponseWriter }{w}, r.WithContext(context.WithoutCancel(r.Context())))
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(h.gone) })
	h.URL = srv.URL
	return h
}

// testDecisionWaitsForTheCall: a capture (and a refund) whose call is held on its way to the provider answers
// 202 unknown. A person deciding it failed while its lease runs is refused (409 call_may_still_land with
// Retry-After) and changes nothing. The call then lands and the provider executes it; the reconciler settles
// the operation from the provider's record, and the intent ends with exactly what the provider captured and
// refunded. A decision after that is 409 invalid_state.
func testDecisionWaitsForTheCall(t *testing.T, h *harness) {
	for _, tc := range []struct{ name, suffix string }{{"capture", "/capture"}, {"refund", "/refunds"}} {
		t.Run(tc.name, func(t *testing.T) {
			held := holdProvider(t, h.providerURL, tc.suffix)
			b := h.setupWith(t, held.URL)
			in := b.createIntent(t, "o-held", `{"order_id":"o-held","amount":"25.00","currency":"USD"}`)
			capture := "/v1/payment_intents/" + in.ID + "/capture"
			var op opstatus.Operation
			if tc.name == "capture" {
				b.agent.Post(capture, `{}`, apitest.Key("held")).Status(t, http.StatusAccepted).Decode(t, &op)
			} else {
				b.agent.Post(capture, `{}`, apitest.Key("cap")).Status(t, http.StatusOK)
				b.agent.Post("/v1/payment_intents/"+in.ID+"/refunds", `{"amount":"4.00"}`, apitest.Key("held")).
					Status(t, http.StatusAccepted).Decode(t, &op)
			}
			if op.State != opstatus.StateUnknown {
				t.Fatalf("held %s: operation %s; want unknown", tc.name, op.State)
			}

			path := "/v1/operations/" + op.ID + "/resolution"
			body := map[string]any{"state": "failed", "evidence": "Provider dashboard shows nothing yet."}
			r := b.approver.Post(path, body, apitest.Key("dec")).Status(t, http.StatusConflict)
			if retry, _ := strconv.Atoi(r.Header.Get("Retry-After")); code(t, r) != "call_may_still_land" || retry < 1 || r.Str(t, "operation_id") != op.ID {
				t.Fatalf("decision while the call may land: %v %s; want 409 call_may_still_land with Retry-After", r.Header, r.Body)
			}
			if got := operation(t, b.agent, "held"); got.State != opstatus.StateUnknown {
				t.Fatalf("after the refused decision the operation is %s", got.State)
			}

			close(held.release)
			<-held.done
			if _, err := b.recovery.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			if got := operation(t, b.agent, "held"); got.State != opstatus.StateSucceeded {
				t.Fatalf("after the call landed the operation is %s; want succeeded from the provider's record", got.State)
			}
			if r := b.approver.Post(path, body, apitest.Key("dec-late")).Status(t, http.StatusConflict); code(t, r) != "invalid_state" {
				t.Errorf("decision on the settled operation: %s", r.Body)
			}
			want := map[string]int64{"authorize": 1, "capture": 1}
			if tc.name == "refund" {
				want["refund"] = 1
			}
			b.assertCounters(t, want)
			b.assertBooks(t, in.ID)
		})
	}
}

// assertBooks compares what the provider really captured and refunded on the intent's authorization with what
// the intent records (its duplicate columns included).
func (b *bundle) assertBooks(t *testing.T, intentID string) {
	t.Helper()
	var books struct {
		ProviderAuthorizationID string `json:"provider_authorization_id"`
		CapturedMinor           int64  `json:"captured_minor"`
		RefundedMinor           int64  `json:"refunded_minor"`
		DuplicateCapturedMinor  int64  `json:"duplicate_captured_minor"`
		DuplicateRefundedMinor  int64  `json:"duplicate_refunded_minor"`
	}
	b.agent.Get("/v1/payment_intents/"+intentID).Status(t, http.StatusOK).Decode(t, &books)
	world, err := b.provider.GetAuthorization(t.Context(), books.ProviderAuthorizationID)
	if err != nil {
		t.Fatal(err)
	}
	if world.CapturedMinor != books.CapturedMinor+books.DuplicateCapturedMinor ||
		world.RefundedMinor != books.RefundedMinor+books.DuplicateRefundedMinor {
		t.Errorf("the provider captured %d and refunded %d; the intent records captured %d+%d, refunded %d+%d",
			world.CapturedMinor, world.RefundedMinor, books.CapturedMinor, books.DuplicateCapturedMinor,
			books.RefundedMinor, books.DuplicateRefundedMinor)
	}
}

// testDecisionSentToAnotherService: a person's decision on an unknown capture sent to a process that runs
// tickets alone (`serve tickets`, without the payments resolver) is refused, 409 resolver_elsewhere naming
// payments, and changes nothing: the operation stays unknown and the intent capturing. Sent to payments, the
// same decision settles the operation and releases the intent, whose books equal the provider's.
func testDecisionSentToAnotherService(t *testing.T, h *harness) {
	b := h.setupWith(t, holdProvider(t, h.providerURL, "/capture").URL)
	in := b.createIntent(t, "o-elsewhere", `{"order_id":"o-elsewhere","amount":"25.00","currency":"USD"}`)
	var op opstatus.Operation
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap")).Status(t, http.StatusAccepted).Decode(t, &op)
	b.endLease(t, op.ID)

	tk, err := tickets.New(b.env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ticketsOnly := b.env.Serve(t, tk).As(servicetest.ApproverSecret)
	path := "/v1/operations/" + op.ID + "/resolution"
	body := map[string]any{"state": "failed", "evidence": "The provider has no capture under the key."}
	r := ticketsOnly.Post(path, body, apitest.Key("dec")).Status(t, http.StatusConflict)
	if code(t, r) != "resolver_elsewhere" || r.Str(t, "service") != "payments" || r.Str(t, "kind") != "payments.capture" {
		t.Fatalf("decision sent to tickets: %s; want 409 resolver_elsewhere naming payments", r.Body)
	}
	if got := operation(t, b.agent, "cap"); got.State != opstatus.StateUnknown {
		t.Fatalf("after the refused decision the operation is %s; want unknown", got.State)
	}
	if got := b.getIntent(t, in.ID).Status; got != "capturing" {
		t.Fatalf("after the refused decision the intent is %s; want capturing", got)
	}

	b.approver.Post(path, body, apitest.Key("dec")).Status(t, http.StatusOK)
	if got := b.getIntent(t, in.ID).Status; got != "requires_capture" {
		t.Fatalf("after the decision sent to payments the intent is %s; want requires_capture", got)
	}
	b.agent.Post("/v1/payment_intents/"+in.ID+"/cancel", `{}`, apitest.Key("cancel")).Status(t, http.StatusOK)
	b.assertCounters(t, map[string]int64{"authorize": 1, "void": 1})
	b.assertBooks(t, in.ID)
}

// testDecisionWhenTheProviderKnows: a capture the provider made whose answer was lost is unknown; once its lease
// has ended a person decides it failed. The provider has a record of the call, so the decision is refused (409
// invalid_state with provider_record) and changes nothing; the reconciler records the capture, and the books
// equal the provider's.
func testDecisionWhenTheProviderKnows(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-knows", `{"order_id":"o-knows","amount":"25.00","currency":"USD"}`)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDrop, Count: 1}); err != nil {
		t.Fatal(err)
	}
	var op opstatus.Operation
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap")).Status(t, http.StatusAccepted).Decode(t, &op)
	b.endLease(t, op.ID)
	body := map[string]any{"state": "failed", "evidence": "Nothing on the dashboard yet."}
	r := b.approver.Post("/v1/operations/"+op.ID+"/resolution", body, apitest.Key("dec")).Status(t, http.StatusConflict)
	if code(t, r) != "invalid_state" || r.JSON(t)["provider_record"] != true {
		t.Fatalf("decision against the provider's record: %s; want 409 invalid_state with provider_record", r.Body)
	}
	if got := b.getIntent(t, in.ID).Status; got != "capturing" {
		t.Fatalf("after the refused decision the intent is %s; want capturing", got)
	}
	if _, err := b.recovery.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := b.getIntent(t, in.ID); got.Status != "succeeded" || got.CapturedMinor != 2500 {
		t.Fatalf("after the reconciler the intent is %s with %d captured; want succeeded with 2500", got.Status, got.CapturedMinor)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	b.assertBooks(t, in.ID)
}
