// Package poll waits in tests for an effect another goroutine, process or database session brings about (a
// worker's pass, a closed connection seen by a server, another test's transaction ending), where no event can
// be awaited. It is a synchronisation point, never a timing assertion: time a test needs to pass is moved on a
// clock (pkg/clock), not waited for.
package poll

import (
	"testing"
	"time"
)

// Until calls cond until it holds, failing the test after a minute (what names the effect in the failure).
// cond runs in the test's goroutine, so it may fail the test itself.
func Until(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not reached within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
