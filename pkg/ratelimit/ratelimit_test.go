package ratelimit

import (
	"testing"
	"time"
)

// TestBucketsPerAccount: an account gets Burst writes at once and then one per 1/PerSecond; another account's
// bucket is its own; a refused write takes no token.
func TestBucketsPerAccount(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	l := New(Limit{PerSecond: 2, Burst: 3})
	l.now = func() time.Time { return now }
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("write %d of the burst refused", i+1)
		}
	}
	ok, wait := l.Allow("a")
	if ok || wait <= 0 || wait > 500*time.Millisecond {
		t.Fatalf("fourth write: ok %v, retry after %s; want refused, at most 500ms", ok, wait)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another account was limited")
	}
	// Refusals take nothing: after 500ms exactly one token is back, however often a was refused meanwhile.
	for range 10 {
		l.Allow("a")
	}
	now = now.Add(500 * time.Millisecond)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("no token after 500ms")
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("two tokens after 500ms")
	}
}
