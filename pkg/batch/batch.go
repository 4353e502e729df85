// Package batch runs concurrent calls of one function together, so that they share one database round trip
// (and one commit, for writes) instead of paying one each.
//
// One batch runs at a time per lane (one lane unless Lanes says more): calls that arrive while it runs wait, and
// go together in the next batch, which the first of them runs in its own goroutine, so no goroutine runs more
// than one batch and nothing runs in the background. A lone call runs at once, alone; the busier the lane, the
// bigger its batches, as with a database's group commit. With more lanes, calls are spread over them by a key;
// calls with the same key share a lane, so their batches run in the order the calls arrived. One lane is the
// default because bigger batches mean fewer round trips and commits, which is what a batch saves:
// docs/benchmarks.md has one lane against four.
//
//	lookups := &batch.Batcher[Ref, Row]{Run: func(ctx context.Context, refs []Ref) ([]Row, error) { ... }}
//	row, err := lookups.Do(ctx, ref.Key, ref)
package batch

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
)

// Batcher runs Run on batches of the calls to Do. Its zero value is not usable; set Run.
type Batcher[T, R any] struct {
	// Run handles a batch: it returns one result per item, in the items' order, or an error that every call of
	// the batch gets. Its context is the caller's that runs the batch, without its cancellation: the other
	// callers still wait for their results.
	Run func(ctx context.Context, items []T) ([]R, error)
	// Max bounds a batch (256 when zero).
	Max int
	// Lanes is how many batches may run at once (1 when zero).
	Lanes int

	mu     sync.Mutex
	queues map[int]*queue[T, R]
}

type queue[T, R any] struct {
	pending []*call[T, R]
}

type call[T, R any] struct {
	item T
	done chan result[R]
	// lead is closed, instead of done being sent to, when this call must run the next batch.
	lead chan struct{}
}

type result[R any] struct {
	value R
	err   error
}

// Do runs item in a batch of its key's lane and returns its result.
func (b *Batcher[T, R]) Do(ctx context.Context, key string, item T) (R, error) {
	c := &call[T, R]{item: item, done: make(chan result[R], 1), lead: make(chan struct{})}
	lane := b.lane(key)
	b.mu.Lock()
	if b.queues == nil {
		b.queues = map[int]*queue[T, R]{}
	}
	q, busy := b.queues[lane]
	if !busy {
		q = &queue[T, R]{}
		b.queues[lane] = q
	}
	q.pending = append(q.pending, c)
	b.mu.Unlock()
	if busy {
		// Another call is running a batch of this lane: ours goes in the next one, which we may have to run.
		select {
		case r := <-c.done:
			return r.value, r.err
		case <-c.lead:
		}
	}
	b.runBatch(ctx, lane, q)
	r := <-c.done
	return r.value, r.err
}

// lane is the lane of key.
func (b *Batcher[T, R]) lane(key string) int {
	n := b.Lanes
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// runBatch runs the pending batch of q, then hands the queue to the first call of the next batch (or removes it
// when nobody is waiting).
func (b *Batcher[T, R]) runBatch(ctx context.Context, lane int, q *queue[T, R]) {
	limit := b.Max
	if limit <= 0 {
		limit = 256
	}
	b.mu.Lock()
	n := min(len(q.pending), limit)
	calls := q.pending[:n:n]
	q.pending = q.pending[n:]
	b.mu.Unlock()

	items := make([]T, len(calls))
	for i, c := range calls {
		items[i] = c.item
	}
	values, panicked, err := b.run(ctx, items)
	if err == nil && len(values) != len(items) {
		err = fmt.Errorf("batch: %d results for %d items", len(values), len(items))
	}
	for i, c := range calls {
		var r result[R]
		if r.err = err; err == nil {
			r.value = values[i]
		}
		c.done <- r
	}

	b.mu.Lock()
	if len(q.pending) == 0 {
		delete(b.queues, lane)
	} else {
		close(q.pending[0].lead)
	}
	b.mu.Unlock()
	if panicked != nil {
		panic(panicked) // after the other calls have their error and the lane its next runner
	}
}

// run calls Run, turning a panic into the batch's error (and returning it, to be raised again).
func (b *Batcher[T, R]) run(ctx context.Context, items []T) (values []R, panicked any, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked, err = p, fmt.Errorf("batch: panic: %v", p)
		}
	}()
	values, err = b.Run(context.WithoutCancel(ctx), items)
	return values, nil, err
}
