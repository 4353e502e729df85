package approval

import "testing"

func TestRouteMatch(t *testing.T) {
	t.Parallel()
	r := Route{Method: "POST", Path: "/v1/payment_intents/:id/capture"}
	for _, tc := range []struct {
		method, path string
		ok           bool
		id           string
	}{
		{"POST", "/v1/payment_intents/pi_1/capture", true, "pi_1"},
		{"post", "/v1/payment_intents/pi_1/capture", true, "pi_1"},
		{"POST", "/v1/payment_intents/pi_1/capture/", false, ""},
		{"POST", "//v1/payment_intents/pi_1/capture", false, ""},
		{"POST", "v1/payment_intents/pi_1/capture", false, ""},
		{"GET", "/v1/payment_intents/pi_1/capture", false, ""},
		{"POST", "/v1/payment_intents//capture", false, ""},
		{"POST", "/v1/payment_intents/pi_1/refunds", false, ""},
		{"POST", "/v1/payment_intents/pi_1/capture/extra", false, ""},
		{"POST", "/v1/payment_intents", false, ""},
	} {
		params, ok := r.match(tc.method, tc.path)
		if ok != tc.ok || (ok && params["id"] != tc.id) {
			t.Errorf("match(%s %s) = %v, %v; want %v, id %q", tc.method, tc.path, params, ok, tc.ok, tc.id)
		}
	}
}

func TestRequestValidate(t *testing.T) {
	t.Parallel()
	good := Request{Method: "POST", Path: "/v1/deploys", IdempotencyKey: "k", Body: []byte(`{"a":1}`)}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Request{
		{Path: "/v1/deploys", IdempotencyKey: "k", Body: []byte(`{}`)},
		{Method: "POST", IdempotencyKey: "k", Body: []byte(`{}`)},
		{Method: "POST", Path: "/v1/deploys", Body: []byte(`{}`)},
		{Method: "POST", Path: "/v1/deploys", IdempotencyKey: "k", Body: []byte(`[1]`)},
		{Method: "POST", Path: "/v1/deploys", IdempotencyKey: "k\n", Body: []byte(`{}`)},
		{Method: "POST", Path: "/v1/deploys/", IdempotencyKey: "k", Body: []byte(`{}`)},
		{Method: "POST", Path: "//v1/deploys", IdempotencyKey: "k", Body: []byte(`{}`)},
		{Method: "POST", Path: "/v1/./deploys", IdempotencyKey: "k", Body: []byte(`{}`)},
		{Method: "POST", Path: "v1/deploys", IdempotencyKey: "k", Body: []byte(`{}`)},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v passed validation", bad)
		}
	}
}
