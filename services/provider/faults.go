package provider

import (
	"context"
	"fmt"
	"time"
)

// armedFault is what remains of one POST /admin/faults.
type armedFault struct {
	mode      FaultMode
	remaining int
	delay     time.Duration
}

// validate reports the first problem with f as a field error.
func (f Fault) validate() *fieldError {
	switch {
	case !validKind(f.Kind):
		return &fieldError{Field: "kind", Message: "must be one of authorize, capture, void, refund"}
	case f.Mode != FaultFail && f.Mode != FaultDrop && f.Mode != FaultDelay && f.Mode != FaultDuplicate:
		return &fieldError{Field: "mode", Message: "must be one of fail, drop, delay, duplicate"}
	case f.Count < 1:
		return &fieldError{Field: "count", Message: "must be at least 1"}
	case f.Mode == FaultDelay && (f.DelayMS < 1 || f.DelayMS > maxFaultDelayMS):
		return &fieldError{Field: "delay_ms", Message: fmt.Sprintf("must be between 1 and %d for mode delay", maxFaultDelayMS)}
	}
	return nil
}

func validKind(k Kind) bool {
	for _, known := range kinds {
		if k == known {
			return true
		}
	}
	return false
}

// armFault queues f behind the faults already armed for its kind.
// s.mu must be held.
func (m *merchant) armFault(f Fault) {
	m.faults[f.Kind] = append(m.faults[f.Kind], armedFault{
		mode:      f.Mode,
		remaining: f.Count,
		delay:     time.Duration(f.DelayMS) * time.Millisecond,
	})
}

// takeFault consumes one call's worth of the oldest fault armed for kind and
// returns it, or the zero armedFault (no fault) when none is armed.
// s.mu must be held.
func (m *merchant) takeFault(kind Kind) armedFault {
	queue := m.faults[kind]
	if len(queue) == 0 {
		return armedFault{}
	}
	f := queue[0]
	queue[0].remaining--
	if queue[0].remaining == 0 {
		queue = queue[1:]
	}
	if len(queue) == 0 {
		delete(m.faults, kind)
	} else {
		m.faults[kind] = queue
	}
	return f
}

// sleepCtx waits d and reports true, or reports false as soon as ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
