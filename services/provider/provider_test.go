package provider_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/services/provider"
)

// testBundle is one provider process with one merchant.
type testBundle struct {
	url    string
	secret string
}

func setup(t *testing.T, cfg provider.Config) (*provider.Client, *testBundle) {
	t.Helper()
	srv := httptest.NewServer(provider.NewServer(cfg, nil).Handler())
	t.Cleanup(srv.Close)
	tb := &testBundle{url: srv.URL, secret: "sk_test_" + t.Name()}
	return provider.NewClientHTTP(srv.URL, tb.secret, apitest.HTTPClient(t, 5*time.Second)), tb
}

// send makes a raw call, for what the client hides: headers and exact bodies.
func (tb *testBundle) send(t *testing.T, method, path, key, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, tb.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tb.secret != "" {
		req.Header.Set("Authorization", "Bearer "+tb.secret)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func mustAuthorize(t *testing.T, c *provider.Client, key string, amountMinor int64) provider.Authorization {
	t.Helper()
	a, err := c.Authorize(t.Context(), key, provider.AuthorizeRequest{AmountMinor: amountMinor, Currency: "USD", Reference: "order-1"})
	if err != nil {
		t.Fatalf("Authorize: %v", err)
	}
	return a
}

func assertCounters(t *testing.T, c *provider.Client, want map[string]int64) {
	t.Helper()
	got, err := c.Counters(t.Context())
	if err != nil {
		t.Fatalf("Counters: %v", err)
	}
	for _, kind := range []string{"authorize", "capture", "void", "refund"} {
		if got[kind] != want[kind] {
			t.Errorf("counter %s = %d; want %d (all: %v)", kind, got[kind], want[kind], got)
		}
	}
}

func assertRefusal(t *testing.T, err error, status int, code string) {
	t.Helper()
	pe, ok := errors.AsType[*provider.Error](err)
	if !ok || pe.Status != status || pe.Code != code {
		t.Fatalf("error = %v; want *provider.Error %d %s", err, status, code)
	}
	if errors.Is(err, provider.ErrOutcomeUnknown) {
		t.Fatalf("error = %v is a refusal, not ErrOutcomeUnknown", err)
	}
}

func assertProblem(t *testing.T, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status = %d; want %d (body %s)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q; want application/problem+json", ct)
	}
	var p struct {
		Type, Title, Detail, Code string
		Status                    int
	}
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem body %s: %v", body, err)
	}
	if p.Code != code || p.Status != status || p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Errorf("problem = %+v; want code %s, status %d, type, title and detail", p, code, status)
	}
}

func TestAuthorizeReplaysStoredAnswer(t *testing.T) {
	t.Parallel()
	c, tb := setup(t, provider.Config{})

	resp1, body1 := tb.send(t, "POST", "/v1/authorizations", "k1", `{"amount_minor":1230,"currency":"USD","reference":"o-1"}`)
	if resp1.StatusCode != http.StatusCreated || resp1.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first call: %d %v %s", resp1.StatusCode, resp1.Header, body1)
	}
	// Same command, other key order and spacing: the same request.
	resp2, body2 := tb.send(t, "POST", "/v1/authorizations", "k1", `{ "reference": "o-1", "currency": "USD", "amount_minor": 1230 }`)
	if resp2.StatusCode != http.StatusCreated || resp2.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v %s", resp2.StatusCode, resp2.Header, body2)
	}
	if string(body1) != string(body2) {
		t.Errorf("replayed body %s differs from stored %s", body2, body1)
	}

	var a provider.Authorization
	if err := json.Unmarshal(body1, &a); err != nil {
		t.Fatal(err)
	}
	want := provider.Authorization{ID: a.ID, Status: "authorized", AmountMinor: 1230, Currency: "USD", Reference: "o-1"}
	if !strings.HasPrefix(a.ID, "auth_") || !reflect.DeepEqual(a, want) {
		t.Errorf("authorization = %+v; want %+v", a, want)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1})
}

func TestKeyReusedForDifferentRequest(t *testing.T) {
	t.Parallel()
	c, tb := setup(t, provider.Config{})
	first := mustAuthorize(t, c, "k1", 1000)

	resp, body := tb.send(t, "POST", "/v1/authorizations", "k1", `{"amount_minor":2000,"currency":"USD","reference":"order-1"}`)
	assertProblem(t, resp, body, http.StatusUnprocessableEntity, "idempotency_key_reused")
	if strings.Contains(string(body), first.ID) {
		t.Errorf("the 422 leaks the stored answer: %s", body)
	}
	// The same key on another route is another request too.
	_, err := c.Capture(t.Context(), "k1", first.ID, 1000)
	assertRefusal(t, err, http.StatusUnprocessableEntity, "idempotency_key_reused")

	again := mustAuthorize(t, c, "k1", 1000)
	if again.ID != first.ID {
		t.Errorf("replay after the refusal = %s; want %s", again.ID, first.ID)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1})
}

func TestConcurrentCapturesWithOneKeyExecuteOnce(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{})
	a := mustAuthorize(t, c, "auth", 1000)

	const callers = 50
	ids := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			cp, err := c.Capture(t.Context(), "cap-key", a.ID, 1000)
			ids[i], errs[i] = cp.ID, err
		})
	}
	wg.Wait()

	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if ids[i] != ids[0] {
			t.Fatalf("caller %d got capture %s; caller 0 got %s", i, ids[i], ids[0])
		}
	}
	assertCounters(t, c, map[string]int64{"authorize": 1, "capture": 1})
}

func TestCaptureTwiceWithDifferentKeys(t *testing.T) {
	t.Parallel()
	c, tb := setup(t, provider.Config{})
	a := mustAuthorize(t, c, "auth", 1000)

	cp, err := c.Capture(t.Context(), "cap-1", a.ID, 600)
	if err != nil {
		t.Fatal(err)
	}
	want := provider.Capture{ID: cp.ID, AuthorizationID: a.ID, AmountMinor: 600, Status: "succeeded"}
	if !strings.HasPrefix(cp.ID, "cap_") || cp != want {
		t.Errorf("capture = %+v; want %+v", cp, want)
	}

	_, err = c.Capture(t.Context(), "cap-2", a.ID, 400)
	assertRefusal(t, err, http.StatusConflict, "already_captured")
	// The refusal is stored under cap-2 and replayed.
	resp, body := tb.send(t, "POST", "/v1/authorizations/"+a.ID+"/capture", "cap-2", `{"amount_minor":400}`)
	assertProblem(t, resp, body, http.StatusConflict, "already_captured")
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("refusal not replayed: %v", resp.Header)
	}

	got, err := c.GetAuthorization(t.Context(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != "captured" || got.CapturedMinor != 600 {
		t.Errorf("authorization after partial capture = %+v; want captured 600", got)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1, "capture": 1})
}

func TestVoidAndCaptureExcludeEachOther(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{})

	voided := mustAuthorize(t, c, "auth-1", 1000)
	v, err := c.Void(t.Context(), "void-1", voided.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != "voided" || v.ID != voided.ID {
		t.Errorf("void = %+v; want %s voided", v, voided.ID)
	}
	_, err = c.Capture(t.Context(), "cap-1", voided.ID, 1000)
	assertRefusal(t, err, http.StatusConflict, "invalid_state")
	_, err = c.Void(t.Context(), "void-2", voided.ID)
	assertRefusal(t, err, http.StatusConflict, "invalid_state")

	captured := mustAuthorize(t, c, "auth-2", 1000)
	if _, err := c.Capture(t.Context(), "cap-2", captured.ID, 1000); err != nil {
		t.Fatal(err)
	}
	_, err = c.Void(t.Context(), "void-3", captured.ID)
	assertRefusal(t, err, http.StatusConflict, "invalid_state")

	_, err = c.Capture(t.Context(), "cap-3", "auth_missing", 1)
	assertRefusal(t, err, http.StatusNotFound, "not_found")
	assertCounters(t, c, map[string]int64{"authorize": 2, "capture": 1, "void": 1})
}

func TestRefundsNeverExceedCaptured(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{})
	a := mustAuthorize(t, c, "auth", 1000)

	_, err := c.Refund(t.Context(), "ref-0", a.ID, 100)
	assertRefusal(t, err, http.StatusConflict, "invalid_state") // nothing captured yet
	_, err = c.Capture(t.Context(), "cap-0", a.ID, 1001)
	assertRefusal(t, err, http.StatusUnprocessableEntity, "amount_too_large")
	if _, err := c.Capture(t.Context(), "cap-1", a.ID, 800); err != nil {
		t.Fatal(err)
	}

	rf, err := c.Refund(t.Context(), "ref-1", a.ID, 500)
	if err != nil {
		t.Fatal(err)
	}
	want := provider.Refund{ID: rf.ID, AuthorizationID: a.ID, AmountMinor: 500, Status: "succeeded"}
	if !strings.HasPrefix(rf.ID, "ref_") || rf != want {
		t.Errorf("refund = %+v; want %+v", rf, want)
	}
	_, err = c.Refund(t.Context(), "ref-2", a.ID, 301)
	assertRefusal(t, err, http.StatusUnprocessableEntity, "amount_too_large")
	if _, err := c.Refund(t.Context(), "ref-3", a.ID, 300); err != nil {
		t.Fatal(err)
	}

	got, err := c.GetAuthorization(t.Context(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.CapturedMinor != 800 || got.RefundedMinor != 800 {
		t.Errorf("authorization = %+v; want 800 captured and refunded", got)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1, "capture": 1, "refund": 2})
}

func TestRequestErrorsStoreNothing(t *testing.T) {
	t.Parallel()
	c, tb := setup(t, provider.Config{})
	valid := `{"amount_minor":100,"currency":"USD"}`
	tests := []struct {
		name, key, body string
		status          int
		code            string
	}{
		{"missing key", "", valid, 400, "idempotency_key_missing"},
		{"key too long", strings.Repeat("k", 256), valid, 400, "idempotency_key_invalid"},
		{"key not printable", "k\u00e9", valid, 400, "idempotency_key_invalid"},
		{"malformed JSON", "k", `{"amount_minor":`, 400, "invalid_request"},
		{"unknown field", "k", `{"amount_minor":100,"currency":"USD","extra":1}`, 400, "invalid_request"},
		{"wrong type", "k", `{"amount_minor":"100","currency":"USD"}`, 400, "invalid_request"},
		{"two values", "k", valid + valid, 400, "invalid_request"},
		{"zero amount", "k", `{"amount_minor":0,"currency":"USD"}`, 422, "validation_failed"},
		{"too large", "k", `{"amount_minor":9007199254740992,"currency":"USD"}`, 422, "validation_failed"},
		{"lowercase currency", "k", `{"amount_minor":100,"currency":"usd"}`, 422, "validation_failed"},
		{"unknown currency", "k", `{"amount_minor":100,"currency":"XXX"}`, 422, "validation_failed"},
	}
	for _, tt := range tests {
		resp, body := tb.send(t, "POST", "/v1/authorizations", tt.key, tt.body)
		if resp.StatusCode != tt.status || !strings.Contains(string(body), `"code":"`+tt.code+`"`) {
			t.Errorf("%s: %d %s; want %d %s", tt.name, resp.StatusCode, body, tt.status, tt.code)
		}
	}

	resp, body := tb.send(t, "POST", "/v1/authorizations", "k", `{"amount_minor":100,"currency":"usd"}`)
	var p struct {
		Errors []struct{ Field, Message string }
	}
	if err := json.Unmarshal(body, &p); err != nil || len(p.Errors) != 1 || p.Errors[0].Field != "currency" {
		t.Errorf("validation problem = %d %s; want errors [{field: currency}]", resp.StatusCode, body)
	}

	// Nothing was stored under "k": it executes now, for the first time.
	if _, err := c.Authorize(t.Context(), "k", provider.AuthorizeRequest{AmountMinor: 100, Currency: "USD"}); err != nil {
		t.Fatalf("Authorize with the refused key: %v", err)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1})
}

func TestAuthenticationAndMerchantScope(t *testing.T) {
	t.Parallel()
	c, tb := setup(t, provider.Config{})
	a := mustAuthorize(t, c, "shared-key", 1000)

	anonymous := &testBundle{url: tb.url}
	resp, body := anonymous.send(t, "GET", "/v1/authorizations/"+a.ID, "", "")
	assertProblem(t, resp, body, http.StatusUnauthorized, "unauthorized")
	resp, body = anonymous.send(t, "GET", "/admin/counters", "", "")
	assertProblem(t, resp, body, http.StatusUnauthorized, "unauthorized")

	other := provider.NewClientHTTP(tb.url, "sk_test_other", apitest.HTTPClient(t, 5*time.Second))
	_, err := other.GetAuthorization(t.Context(), a.ID)
	assertRefusal(t, err, http.StatusNotFound, "not_found")
	_, err = other.Capture(t.Context(), "cap", a.ID, 1000)
	assertRefusal(t, err, http.StatusNotFound, "not_found")
	// Keys are per merchant: the other merchant's "shared-key" is its own.
	b, err := other.Authorize(t.Context(), "shared-key", provider.AuthorizeRequest{AmountMinor: 1000, Currency: "USD", Reference: "order-1"})
	if err != nil || b.ID == a.ID {
		t.Fatalf("other merchant's Authorize = %+v, %v; want a new authorization", b, err)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1})
	assertCounters(t, other, map[string]int64{"authorize": 1})
}

func TestLookup(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{})
	const key = "order/42 retry?#1" // needs escaping in a path
	a := mustAuthorize(t, c, key, 1000)

	res, err := c.Lookup(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	var stored provider.Authorization
	if err := json.Unmarshal(res.Body, &stored); err != nil {
		t.Fatalf("stored body %s: %v", res.Body, err)
	}
	if !res.Found || res.Status != http.StatusCreated || res.Method != "POST" || res.Path != "/v1/authorizations" || res.Key != key || !reflect.DeepEqual(stored, a) {
		t.Errorf("Lookup = %+v (body %+v); want the 201 authorization %+v", res, stored, a)
	}

	res, err = c.Lookup(t.Context(), "never-used")
	if err != nil || res.Found {
		t.Errorf("Lookup of an unused key = %+v, %v; want not found", res, err)
	}
}

func TestFaultFailExecutesNothing(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{FaultInjection: true})
	a := mustAuthorize(t, c, "auth", 1000)
	if err := c.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultFail, Count: 1}); err != nil {
		t.Fatal(err)
	}

	_, err := c.Capture(t.Context(), "cap", a.ID, 1000)
	if !errors.Is(err, provider.ErrOutcomeUnknown) {
		t.Fatalf("Capture under fail = %v; want ErrOutcomeUnknown", err)
	}
	if pe, ok := errors.AsType[*provider.Error](err); !ok || pe.Status != 503 || pe.Code != "provider_unavailable" {
		t.Errorf("Capture under fail = %v; want a 503 provider_unavailable *Error", err)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1})
	if res, err := c.Lookup(t.Context(), "cap"); err != nil || res.Found {
		t.Errorf("Lookup after fail = %+v, %v; want not found", res, err)
	}

	// The fault is spent; the retry executes, once.
	if _, err := c.Capture(t.Context(), "cap", a.ID, 1000); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if _, err := c.Capture(t.Context(), "cap", a.ID, 1000); err != nil {
		t.Fatalf("second retry: %v", err)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1, "capture": 1})
}

func TestFaultDropExecutesAndLosesTheAnswer(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{FaultInjection: true})
	a := mustAuthorize(t, c, "auth", 1000) // leaves an idle connection to reuse
	if err := c.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDrop, Count: 1}); err != nil {
		t.Fatal(err)
	}

	_, err := c.Capture(t.Context(), "cap", a.ID, 700)
	if !errors.Is(err, provider.ErrOutcomeUnknown) {
		t.Fatalf("Capture under drop = %v; want ErrOutcomeUnknown", err)
	}
	if _, ok := errors.AsType[*provider.Error](err); ok {
		t.Errorf("Capture under drop = %v; want a connection error, not an answer", err)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1, "capture": 1})

	res, err := c.Lookup(t.Context(), "cap")
	if err != nil || !res.Found || res.Status != http.StatusOK {
		t.Fatalf("Lookup after drop = %+v, %v; want the stored 200", res, err)
	}
	var stored provider.Capture
	if err := json.Unmarshal(res.Body, &stored); err != nil || stored.AmountMinor != 700 || stored.AuthorizationID != a.ID {
		t.Fatalf("stored capture = %+v, %v", stored, err)
	}

	// A retry with the key gets the lost answer and executes nothing.
	again, err := c.Capture(t.Context(), "cap", a.ID, 700)
	if err != nil || again != stored {
		t.Errorf("retry = %+v, %v; want the stored %+v", again, err, stored)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1, "capture": 1})
}

func TestFaultDelayOutlastsTheCaller(t *testing.T) {
	t.Parallel()
	c, tb := setup(t, provider.Config{FaultInjection: true})
	a := mustAuthorize(t, c, "auth", 1000)
	if err := c.InjectFault(t.Context(), provider.Fault{Kind: provider.KindVoid, Mode: provider.FaultDelay, Count: 1, DelayMS: 60_000}); err != nil {
		t.Fatal(err)
	}

	impatient := provider.NewClientHTTP(tb.url, tb.secret, apitest.HTTPClient(t, 200*time.Millisecond))
	_, err := impatient.Void(t.Context(), "void", a.ID)
	if !errors.Is(err, provider.ErrOutcomeUnknown) {
		t.Fatalf("Void under delay = %v; want ErrOutcomeUnknown", err)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1, "void": 1})
	got, err := c.GetAuthorization(t.Context(), a.ID)
	if err != nil || got.Status != "voided" {
		t.Errorf("authorization after delayed void = %+v, %v; want voided", got, err)
	}
	if res, err := c.Lookup(t.Context(), "void"); err != nil || !res.Found || res.Status != http.StatusOK {
		t.Errorf("Lookup after delay = %+v, %v; want the stored 200", res, err)
	}
}

func TestFaultsSkipReplaysAndQueueInOrder(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{FaultInjection: true})
	first := mustAuthorize(t, c, "auth-1", 1000)
	for _, f := range []provider.Fault{
		{Kind: provider.KindAuthorize, Mode: provider.FaultFail, Count: 2},
		{Kind: provider.KindAuthorize, Mode: provider.FaultDrop, Count: 1},
	} {
		if err := c.InjectFault(t.Context(), f); err != nil {
			t.Fatal(err)
		}
	}

	// A replay is not a call the faults see.
	if again := mustAuthorize(t, c, "auth-1", 1000); again.ID != first.ID {
		t.Fatalf("replay = %s; want %s", again.ID, first.ID)
	}
	req := provider.AuthorizeRequest{AmountMinor: 1000, Currency: "USD"}
	for i, key := range []string{"auth-2", "auth-2", "auth-2"} {
		_, err := c.Authorize(t.Context(), key, req)
		if !errors.Is(err, provider.ErrOutcomeUnknown) {
			t.Fatalf("call %d = %v; want ErrOutcomeUnknown", i, err)
		}
	}
	assertCounters(t, c, map[string]int64{"authorize": 2}) // two fails, then the drop executed
	if _, err := c.Authorize(t.Context(), "auth-2", req); err != nil {
		t.Fatalf("after the faults: %v", err)
	}

	if err := c.InjectFault(t.Context(), provider.Fault{Kind: provider.KindAuthorize, Mode: provider.FaultFail, Count: 5}); err != nil {
		t.Fatal(err)
	}
	if err := c.ClearFaults(t.Context()); err != nil {
		t.Fatal(err)
	}
	mustAuthorize(t, c, "auth-3", 1000)
	assertCounters(t, c, map[string]int64{"authorize": 3})

	if err := c.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	assertCounters(t, c, map[string]int64{})
	_, err := c.GetAuthorization(t.Context(), first.ID)
	assertRefusal(t, err, http.StatusNotFound, "not_found")
}

func TestInvalidFaults(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{FaultInjection: true})
	for _, f := range []provider.Fault{
		{Kind: "charge", Mode: provider.FaultFail, Count: 1},
		{Kind: provider.KindCapture, Mode: "explode", Count: 1},
		{Kind: provider.KindCapture, Mode: provider.FaultFail, Count: 0},
		{Kind: provider.KindCapture, Mode: provider.FaultDelay, Count: 1},
	} {
		err := c.InjectFault(t.Context(), f)
		assertRefusal(t, err, http.StatusUnprocessableEntity, "validation_failed")
	}
}

func TestFaultRoutesNeedFaultInjection(t *testing.T) {
	t.Parallel()
	c, tb := setup(t, provider.Config{})

	err := c.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultFail, Count: 1})
	assertRefusal(t, err, http.StatusNotFound, "not_found")
	assertRefusal(t, c.ClearFaults(t.Context()), http.StatusNotFound, "not_found")
	assertRefusal(t, c.Reset(t.Context()), http.StatusNotFound, "not_found")

	// Nothing was armed: the capture executes.
	a := mustAuthorize(t, c, "auth", 1000)
	if _, err := c.Capture(t.Context(), "cap", a.ID, 1000); err != nil {
		t.Fatal(err)
	}
	resp, body := tb.send(t, "GET", "/admin/counters", "", "")
	if resp.StatusCode != http.StatusOK || string(body) != `{"authorize":1,"capture":1,"refund":0,"void":0}` {
		t.Errorf("counters = %d %s", resp.StatusCode, body)
	}
}

func TestDelayedAnswerIsReplayedAtOnce(t *testing.T) {
	t.Parallel()
	c, tb := setup(t, provider.Config{FaultInjection: true})
	a := mustAuthorize(t, c, "auth", 1000)
	if err := c.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDelay, Count: 1, DelayMS: 60_000}); err != nil {
		t.Fatal(err)
	}
	impatient := provider.NewClientHTTP(tb.url, tb.secret, apitest.HTTPClient(t, 200*time.Millisecond))
	if _, err := impatient.Capture(t.Context(), "cap", a.ID, 1000); !errors.Is(err, provider.ErrOutcomeUnknown) {
		t.Fatalf("Capture = %v; want ErrOutcomeUnknown", err)
	}
	// The answer was stored before the delay: the retry replays it at once.
	if _, err := impatient.Capture(t.Context(), "cap", a.ID, 1000); err != nil {
		t.Fatalf("retry = %v", err)
	}
	assertCounters(t, c, map[string]int64{"authorize": 1, "capture": 1})
}

// TestEffectsListWhatExecuted: every call executed with a success is listed once, oldest first, with the
// authorization as it stands after all of them and the caller's metadata; refusals and replays are not effects.
func TestEffectsListWhatExecuted(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, provider.Config{})
	ctx := t.Context()
	before := time.Now()
	a, err := c.Authorize(ctx, "k-auth", provider.AuthorizeRequest{AmountMinor: 900, Currency: "USD", Reference: "order-9",
		Metadata: map[string]string{"account_id": "acct_1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Authorize(ctx, "k-auth", provider.AuthorizeRequest{AmountMinor: 900, Currency: "USD", Reference: "order-9",
		Metadata: map[string]string{"account_id": "acct_1"}}); err != nil {
		t.Fatal(err) // a replay: no second effect
	}
	if _, err := c.Capture(ctx, "k-cap", a.ID, 800); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Capture(ctx, "k-cap-again", a.ID, 800); err == nil {
		t.Fatal("second capture accepted")
	}
	if _, err := c.Refund(ctx, "k-ref", a.ID, 300); err != nil {
		t.Fatal(err)
	}
	effects, err := c.Effects(ctx, before)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []provider.Kind
	for _, e := range effects {
		kinds = append(kinds, e.Kind)
		if e.AuthorizationID != a.ID || len(e.Effects) != 1 || e.Authorization.CapturedMinor != 800 ||
			e.Authorization.RefundedMinor != 300 || e.Authorization.Metadata["account_id"] != "acct_1" {
			t.Errorf("effect %+v; want on %s, one execution, 800 captured, 300 refunded, account acct_1", e, a.ID)
		}
	}
	if got := fmt.Sprint(kinds); got != "[authorize capture refund]" {
		t.Fatalf("effects = %s; want authorize, capture, refund", got)
	}
	if later, err := c.Effects(ctx, time.Now().Add(time.Minute)); err != nil || len(later) != 0 {
		t.Fatalf("effects since a minute from now = %v, %v; want none", later, err)
	}
}
