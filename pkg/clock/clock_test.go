package clock_test

import (
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/clock"
)

// TestClock: a nil or unmoved clock is the real time and leaves the database's clock alone; a moved one is
// ahead by what it was moved, and says so to the database.
func TestClock(t *testing.T) {
	t.Parallel()
	var real *clock.Clock
	before := time.Now()
	if now := real.Now(); now.Before(before) || real.NowOrNil() != nil {
		t.Fatalf("nil clock: %v, %v; want the real time and nil", now, real.NowOrNil())
	}
	c := &clock.Clock{}
	if c.NowOrNil() != nil {
		t.Fatal("an unmoved clock gave the database a time")
	}
	c.Advance(time.Hour)
	c.Advance(time.Hour)
	at := c.NowOrNil()
	if now := c.Now(); now.Before(before.Add(2*time.Hour)) || at == nil || at.Before(before.Add(2*time.Hour)) {
		t.Fatalf("moved two hours: %v, %v; want both two hours ahead of %v", now, at, before)
	}
}
