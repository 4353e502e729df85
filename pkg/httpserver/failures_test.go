package httpserver_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/ratelimit"
)

// throttled is a router as internal/service builds it: the throttle, then authentication with the demo keys.
func throttled(f *ratelimit.Failures, proxies ...netip.Prefix) http.Handler {
	r := httpserver.NewRouter(httpserver.Options{Logger: slog.New(slog.DiscardHandler), TrustedProxies: proxies})
	r.Group("", httpserver.Failures(f), httpserver.Wrap(auth.Middleware(auth.Demo()))).GET("/v1/things", func(c *gin.Context) {
		c.Status(http.StatusOK)
	})
	return r
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

// TestFailuresCountTheForwardedClientOnlyFromATrustedProxy: X-Forwarded-For names the client only when the
// connection comes from a trusted proxy. From anyone else the header changes nothing, so a guesser cannot
// make up a fresh address for each guess; behind the proxy, its clients are counted apart.
func TestFailuresCountTheForwardedClientOnlyFromATrustedProxy(t *testing.T) {
	t.Parallel()
	f := ratelimit.NewFailures(ratelimit.Limit{PerSecond: 0.001, Burst: 2})
	h := throttled(f, netip.MustParsePrefix("10.0.0.0/8"))
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
