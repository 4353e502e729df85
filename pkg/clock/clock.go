// Package clock is the time that leases, expiries and pruning ask for: the real time in production, a time a test
// moves forward instead of sleeping through a lease (river's baseservice.TimeGenerator and its test stub).
//
//	h := &idem.Handler{DB: db, Retention: time.Hour, Clock: &clock.Clock{}}
//	h.Clock.Advance(time.Hour + time.Minute) // a test: the stored responses are past their retention
//	h.Prune(ctx)
package clock

import (
	"sync"
	"time"
)

// Clock tells the time. A nil or zero Clock is the real one: Now is time.Now and NowOrNil is nil, so what the
// database decides stays on the database's clock. Once moved (Advance), Now is the real time plus how far it
// was moved, and NowOrNil says the same to the database; the real time keeps running underneath, so deadlines
// and timeouts still end.
type Clock struct {
	mu     sync.RWMutex
	moved  bool
	offset time.Duration
}

// Now is the time: time.Now, plus how far the clock was moved.
func (c *Clock) Now() time.Time {
	if c == nil {
		return time.Now()
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return time.Now().Add(c.offset)
}

// NowOrNil is Now once the clock was moved, and nil before: a statement given nil uses the database's now().
func (c *Clock) NowOrNil() *time.Time {
	if c == nil {
		return nil
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.moved {
		return nil
	}
	now := time.Now().Add(c.offset)
	return &now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.moved = true
	c.offset += d
}
