package ratelimit

import (
	"math"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/felixge/httpsnoop"

	"golang.org/x/time/rate"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Failures throttles guessing: each answer 401 (an unknown API key, a refused console sign-in) takes a token
// from the bucket of the client's address (ClientPrefix: on gin, of gin's ClientIP, which believes
// X-Forwarded-For only from a trusted proxy). A client whose bucket is empty gets 429 rate_limited, with
// Retry-After, on every request, before its key is looked at: a guess is refused whether or not it would have
// been right, so refusals tell nothing. A client that never fails has no bucket and is never slowed; clients
// behind one address (a NAT) share its budget of failures.
//
//	failures := ratelimit.NewFailures(ratelimit.Limit{PerSecond: 0.5, Burst: 20})
//	api := failures.Middleware(auth.Middleware(keys)(mux))
//
// Share one Failures between the services of a process, and put its Middleware in front of every route that
// authenticates (the API, the console's sign-in).
type Failures struct {
	limit Limit
	now   func() time.Time

	mu      sync.Mutex
	buckets map[netip.Prefix]*rate.Limiter
}

// maxFailingClients bounds the buckets a Failures holds. Past it, the buckets that are full again (worth no
// more than none) are dropped, then any: only a client failing from more addresses than this gets a fresh
// budget back early.
const maxFailingClients = 100_000

// NewFailures returns a Failures allowing each client Burst failures at once and PerSecond on average after;
// both must be positive.
func NewFailures(l Limit) *Failures {
	return &Failures{limit: l, now: time.Now, buckets: map[netip.Prefix]*rate.Limiter{}}
}

// Middleware refuses a client without a token left (429), and after the request counts an answer 401 against
// it; the client is the connection's peer (r.RemoteAddr). The refusal does not read the request body and
// closes the connection (problem.CloseUnread). Behind a proxy, count by the client it names instead:
// httpserver.Failures does on gin, by gin's ClientIP.
func (f *Failures) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			next.ServeHTTP(w, r) // not a TCP peer: nothing to count by
			return
		}
		client := peer.Addr()
		if err := f.Refusal(client); err != nil {
			problem.CloseUnread(w, r)
			problem.Write(w, r, err)
			return
		}
		f.Answered(client, httpsnoop.CaptureMetrics(next, w, r).Code)
	})
}

// Refusal is the rate_limited problem (429, Retry-After) that answers client when it has no token left, before
// its request is looked at; nil when it has one.
func (f *Failures) Refusal(client netip.Addr) error {
	wait := f.wait(ClientPrefix(client))
	if wait <= 0 {
		return nil
	}
	return &problem.Error{
		Code: "rate_limited",
		Detail: "too many requests from this address were refused for an unknown API key or a failed sign-in; " +
			"nothing was done: send the request again after Retry-After seconds, with a valid key",
		RetryAfter: max(int(math.Ceil(wait.Seconds())), 1),
	}
}

// Answered counts the answer to a request of client: a 401 takes a token from its bucket.
func (f *Failures) Answered(client netip.Addr, status int) {
	if status == http.StatusUnauthorized {
		f.fail(ClientPrefix(client))
	}
}

// wait is how long client must wait for a token, 0 when it has one.
func (f *Failures) wait(client netip.Prefix) time.Duration {
	f.mu.Lock()
	b := f.buckets[client]
	f.mu.Unlock()
	if b == nil {
		return 0
	}
	tokens := b.TokensAt(f.now())
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) / f.limit.PerSecond * float64(time.Second))
}

// fail takes a token from client's bucket. Several requests may have passed wait on the last token at once:
// each still takes its own, leaving the bucket in debt, so their guesses cost the client later ones.
func (f *Failures) fail(client netip.Prefix) {
	now := f.now()
	f.mu.Lock()
	b := f.buckets[client]
	if b == nil {
		if len(f.buckets) >= maxFailingClients {
			f.sweep(now)
		}
		b = rate.NewLimiter(rate.Limit(f.limit.PerSecond), f.limit.Burst)
		f.buckets[client] = b
	}
	f.mu.Unlock()
	b.ReserveN(now, 1)
}

// sweep makes room for a bucket; f.mu is held.
func (f *Failures) sweep(now time.Time) {
	for client, b := range f.buckets {
		if b.TokensAt(now) >= float64(f.limit.Burst) {
			delete(f.buckets, client)
		}
	}
	for client := range f.buckets {
		if len(f.buckets) < maxFailingClients {
			return
		}
		delete(f.buckets, client)
	}
}
