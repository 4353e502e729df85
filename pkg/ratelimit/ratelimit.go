// Package ratelimit limits the writes of each account with a token bucket, so that one account cannot take
// the database, the provider or the deploy queue from the others (Limiter; reads are not limited), and the
// refused keys of each client address, so that nobody can guess keys at the speed of the network (Failures).
//
// A bucket holds Burst tokens and refills at PerSecond; a write takes one. When none is left the write is
// answered 429 rate_limited with Retry-After (seconds until a token is back), before anything is decoded,
// claimed or stored, so the caller retries the same request with the same Idempotency-Key later.
//
//	limiter := ratelimit.New(ratelimit.Limit{PerSecond: 50, Burst: 100})
//	api := auth.Middleware(keys)(limiter.Middleware(mux))
//
// Both speak net/http; pkg/httpserver puts them on gin (httpserver.Wrap(limiter.Middleware),
// httpserver.Failures).
//
// One Limiter serves every service of a process: an account's budget is per process, not per port.
package ratelimit

import (
	"math"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Limit is the budget of one account: PerSecond writes on average, up to Burst at once.
type Limit struct {
	PerSecond float64
	Burst     int
}

// Limiter holds one bucket per account. Accounts come from API_KEYS, so the set of buckets is bounded.
type Limiter struct {
	limit Limit
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// New returns a Limiter for l; PerSecond and Burst must be positive.
func New(l Limit) *Limiter {
	return &Limiter{limit: l, now: time.Now, buckets: map[string]*rate.Limiter{}}
}

// Allow takes a token from account's bucket. When there is none it takes nothing and says how long until
// there is one.
func (l *Limiter) Allow(account string) (ok bool, retryAfter time.Duration) {
	l.mu.Lock()
	b, found := l.buckets[account]
	if !found {
		b = rate.NewLimiter(rate.Limit(l.limit.PerSecond), l.limit.Burst)
		l.buckets[account] = b
	}
	l.mu.Unlock()
	now := l.now()
	r := b.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// Middleware limits the writes (POST, PUT, PATCH, DELETE) of the authenticated account; it must run after
// auth.Middleware. On gin: httpserver.Wrap(limiter.Middleware).
func (l *Limiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		ok, wait := l.Allow(auth.From(r.Context()).AccountID)
		if !ok {
			seconds := int(math.Ceil(wait.Seconds()))
			problem.Write(w, r, &problem.Error{
				Code:       "rate_limited",
				Detail:     "this account sends writes faster than its limit; nothing was done: send the same request, with the same Idempotency-Key, after Retry-After seconds",
				RetryAfter: max(seconds, 1),
			})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ClientPrefix is the address limits count a client by (Failures, and httpserver's connection caps): an IPv4
// address, or the /64 of an IPv6 address, which one host usually holds whole.
func ClientPrefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}
