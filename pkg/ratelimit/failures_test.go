package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auth"
)

// throttled is a server as an adopter on net/http builds it: the throttle, then authentication with the demo
// keys. It counts the requests that reached the handler.
func throttled(f *Failures) (http.Handler, *int) {
	reached := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/things", func(w http.ResponseWriter, _ *http.Request) {
		reached++
		w.WriteHeader(http.StatusOK)
	})
	return f.Middleware(auth.Middleware(auth.Demo())(mux)), &reached
}

func send(h http.Handler, remote, secret string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/v1/things", nil)
	req.RemoteAddr = remote
	req.Header.Set("Authorization", "Bearer "+secret)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestFailedKeysAreThrottledPerAddress: an address gets Burst unknown keys, then 429 with Retry-After on every
// request, a right key included (which is not even looked at), until a token is back; another address, and
// a key that never failed, are not slowed.
func TestFailedKeysAreThrottledPerAddress(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	f := NewFailures(Limit{PerSecond: 0.5, Burst: 3})
	f.now = func() time.Time { return now }
	h, reached := throttled(f)
	const guesser, other = "192.0.2.7:1234", "198.51.100.1:1234"

	for range 10 {
		if rec := send(h, other, "demo-agent-secret"); rec.Code != http.StatusOK {
			t.Fatalf("a valid key: %d", rec.Code)
		}
	}
	for i := range 3 {
		if rec := send(h, guesser, "guess"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d of the burst: %d", i+1, rec.Code)
		}
	}
	before := *reached
	rec := send(h, guesser, "demo-agent-secret")
	retry, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
	if rec.Code != http.StatusTooManyRequests || retry < 1 || retry > 2 || rec.Header().Get("Connection") != "close" {
		t.Fatalf("after the burst, the right key: %d, Retry-After %q, Connection %q; want 429 within 2 s, closing",
			rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("Connection"))
	}
	if *reached != before {
		t.Fatal("a throttled request reached the handler")
	}
	// Another address of the same /64 is the same IPv6 client; another /64 is not.
	for range 3 {
		send(h, "[2001:db8:1:2::1]:1", "guess")
	}
	if rec := send(h, "[2001:db8:1:2::ffff]:1", "guess"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("another address of a throttled /64: %d", rec.Code)
	}
	if rec := send(h, "[2001:db8:1:3::1]:1", "demo-agent-secret"); rec.Code != http.StatusOK {
		t.Fatalf("another /64: %d", rec.Code)
	}
	if rec := send(h, other, "demo-agent-secret"); rec.Code != http.StatusOK {
		t.Fatalf("another address: %d", rec.Code)
	}
	// Refusals cost nothing: after 2 s exactly one guess is allowed again, however often it was refused.
	now = now.Add(2 * time.Second)
	if rec := send(h, guesser, "guess"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("after 2 s: %d", rec.Code)
	}
	if rec := send(h, guesser, "demo-agent-secret"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a second request after 2 s: %d", rec.Code)
	}
	now = now.Add(2 * time.Second)
	if rec := send(h, guesser, "demo-agent-secret"); rec.Code != http.StatusOK {
		t.Fatalf("the right key once a token is back: %d", rec.Code)
	}
}

// TestFailuresHoldBoundedState: past maxFailingClients, the buckets that are full again make room.
func TestFailuresHoldBoundedState(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	f := NewFailures(Limit{PerSecond: 1, Burst: 1})
	f.now = func() time.Time { return now }
	for i := range maxFailingClients {
		f.fail(ClientPrefix(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})))
	}
	now = now.Add(time.Minute)
	f.fail(ClientPrefix(netip.MustParseAddr("192.0.2.7")))
	if n := len(f.buckets); n != 1 {
		t.Fatalf("%d buckets after the sweep; want 1", n)
	}
}

func TestClientPrefix(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"192.0.2.7":               "192.0.2.7/32",
		"::ffff:192.0.2.7":        "192.0.2.7/32",
		"2001:db8:1:2:3:4:5:6":    "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1234": "2001:db8:1:2::/64",
	} {
		if got := ClientPrefix(netip.MustParseAddr(in)).String(); got != want {
			t.Errorf("ClientPrefix(%s) = %s; want %s", in, got, want)
		}
	}
}
