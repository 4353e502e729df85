package tickets_test

import (
	"testing"
	"time"
)

// waitFor polls cond for up to 10 s; it is a synchronisation point, not a timing assertion.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
