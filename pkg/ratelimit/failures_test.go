package ratelimit

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
)

// throttled is a router as pkg/service builds it: the throttle, then authentication with the demo keys. It
// counts the requests that reached the handler.
func throttled(f *Failures, proxies ...netip.Prefix) (http.Handler, *int) {
	r := httpserver.NewRouter(httpserver.Options{Logger: slog.New(slog.DiscardHandler), TrustedProxies: proxies})
	reached := 0
	r.Group("", f.Middleware(), httpserver.Wrap(auth.Middleware(auth.Demo()))).GET("/v1/things", func(c *gin.Context) {
		reached++
		c.Status(http.StatusOK)
	})
	return r, &reached
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

// TestFailuresCountTheForwardedClientOnlyFromATrustedProxy: X-Forwarded-For names the client only when the
// connection comes from a trusted proxy. From anyone else the header changes nothing, so a guesser cannot
// make up a fresh address for each guess; behind the proxy, its clients are counted apart.
func TestFailuresCountTheForwardedClientOnlyFromATrustedProxy(t *testing.T) {
	t.Parallel()
	f := NewFailures(Limit{PerSecond: 0.001, Burst: 2})
	h, _ := throttled(f, netip.MustParsePrefix("10.0.0.0/8"))
	for i := range 5 {
		send(h, "192.0.2.7:1", "guess", "X-Forwarded-For", "203.0.113."+strconv.Itoa(i))
	}
	if rec := send(h, "192.0.2.7:1", "guess", "X-Forwarded-For", "203.0.113.99"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a made-up X-Forwarded-For escaped the throttle: %d", rec.Code)
	}
	for range 2 {
		send(h, "10.0.0.5:1", "guess", "X-Forwarded-For", "203.0.113.1")
	}
	if rec := send(h, "10.0.0.5:1", "guess", "X-Forwarded-For", "203.0.113.1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a client behind the proxy was not throttled: %d", rec.Code)
	}
	if rec := send(h, "10.0.0.5:1", "demo-agent-secret", "X-Forwarded-For", "203.0.113.2"); rec.Code != http.StatusOK {
		t.Fatalf("another client behind the proxy was throttled with it: %d", rec.Code)
	}
}

// TestFailuresHoldBoundedState: past maxFailingClients, the buckets that are full again make room.
func TestFailuresHoldBoundedState(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	f := NewFailures(Limit{PerSecond: 1, Burst: 1})
	f.now = func() time.Time { return now }
	for i := range maxFailingClients {
		f.fail(httpserver.ClientPrefix(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})))
	}
	now = now.Add(time.Minute)
	f.fail(httpserver.ClientPrefix(netip.MustParseAddr("192.0.2.7")))
	if n := len(f.buckets); n != 1 {
		t.Fatalf("%d buckets after the sweep; want 1", n)
	}
}
