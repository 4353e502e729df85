package tickets_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/ratelimit"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// TestWritesAreRateLimitedPerAccount: once an account has spent its burst, its next write is 429 rate_limited
// with Retry-After and does nothing (no ticket, no claimed key); reads go on, and another account's writes are
// not affected.
func TestWritesAreRateLimitedPerAccount(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// One token per 1000 s: the burst is all the test can spend.
	limiter := ratelimit.New(ratelimit.Limit{PerSecond: 0.001, Burst: 3})
	agent := env.ServeHTTP(t, service.HTTP{WriteLimiter: limiter}, svc)
	body := func(i int) string { return fmt.Sprintf(`{"project":"ops","title":"t%d"}`, i) }
	for i := range 3 {
		agent.Post("/v1/tickets", body(i), apitest.Key(fmt.Sprint("k", i))).Status(t, http.StatusCreated)
	}
	res := agent.Post("/v1/tickets", body(3), apitest.Key("k3")).Status(t, http.StatusTooManyRequests)
	retry, err := strconv.Atoi(res.Header.Get("Retry-After"))
	if res.Str(t, "code") != "rate_limited" || err != nil || retry < 1 {
		t.Fatalf("limited write: %v %s", res.Header, res.Body)
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 3 {
		t.Errorf("%d tickets, want the 3 of the burst", n)
	}
	if n := count(t, env, `SELECT count(*) FROM operations WHERE idempotency_key = 'k3' AND key_state IS NOT NULL`); n != 0 {
		t.Error("the limited write claimed its key")
	}
	agent.Get("/v1/tickets").Status(t, http.StatusOK)
	agent.As(servicetest.OtherAgentSecret).Post("/v1/tickets", body(4), apitest.Key("k4")).Status(t, http.StatusCreated)
}
