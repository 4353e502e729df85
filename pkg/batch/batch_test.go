package batch_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/retrysafe/retrysafe/pkg/batch"
)

// held is a Batcher whose first batch waits until released, so that calls made meanwhile queue up behind it.
type held struct {
	b       *batch.Batcher[int, int]
	started chan struct{}
	release chan struct{}
	mu      sync.Mutex
	batches [][]int
}

func newHeld(max int, fail error) *held {
	h := &held{started: make(chan struct{}), release: make(chan struct{})}
	var first atomic.Bool
	h.b = &batch.Batcher[int, int]{Max: max, Lanes: 1, Run: func(ctx context.Context, items []int) ([]int, error) {
		if first.CompareAndSwap(false, true) {
			close(h.started)
			<-h.release
		}
		h.mu.Lock()
		h.batches = append(h.batches, append([]int(nil), items...))
		h.mu.Unlock()
		if fail != nil {
			return nil, fail
		}
		out := make([]int, len(items))
		for i, v := range items {
			out[i] = v * 10
		}
		return out, nil
	}}
	return h
}

// TestCallsWaitingShareABatch: while one batch runs, 50 calls arrive; they run as one next batch (two with Max
// 30), each gets the result of its own item, and the lone first call ran alone.
func TestCallsWaitingShareABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			max  int
			want []int // batch sizes
		}{{0, []int{1, 50}}, {30, []int{1, 30, 20}}} {
			h := newHeld(tc.max, nil)
			ctx := context.Background()
			firstDone := make(chan int)
			go func() {
				v, _ := h.b.Do(ctx, "k", 1000)
				firstDone <- v
			}()
			<-h.started
			var wg sync.WaitGroup
			got := make([]int, 50)
			errs := make([]error, 50)
			for i := range 50 {
				wg.Go(func() {
					got[i], errs[i] = h.b.Do(ctx, "k", i)
				})
			}
			synctest.Wait() // every call is parked in Do
			close(h.release)
			wg.Wait()
			if v := <-firstDone; v != 10000 {
				t.Fatalf("first call got %d", v)
			}
			for i := range 50 {
				if errs[i] != nil || got[i] != i*10 {
					t.Fatalf("call %d got %d, %v; want %d", i, got[i], errs[i], i*10)
				}
			}
			var sizes []int
			for _, b := range h.batches {
				sizes = append(sizes, len(b))
			}
			if len(sizes) != len(tc.want) {
				t.Fatalf("max %d: batches of %v; want %v", tc.max, sizes, tc.want)
			}
			for i := range sizes {
				if sizes[i] != tc.want[i] {
					t.Fatalf("max %d: batches of %v; want %v", tc.max, sizes, tc.want)
				}
			}
		}
	})
}

// TestBatchErrorReachesEveryCall: a batch that fails fails each of its calls with its error.
func TestBatchErrorReachesEveryCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		h := newHeld(0, boom)
		ctx := context.Background()
		go h.b.Do(ctx, "k", 1)
		<-h.started
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := range 10 {
			wg.Go(func() {
				if _, err := h.b.Do(ctx, "k", i); errors.Is(err, boom) {
					failed.Add(1)
				}
			})
		}
		synctest.Wait() // every call is parked in Do
		close(h.release)
		wg.Wait()
		if failed.Load() != 10 {
			t.Fatalf("%d of 10 calls got the batch's error", failed.Load())
		}
	})
}

// TestPanicFailsTheBatchAndFreesTheLane: Run panics in the goroutine that runs the batch; the other calls of the
// batch get an error instead of waiting forever, and the lane runs the next batch.
func TestPanicFailsTheBatchAndFreesTheLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		release := make(chan struct{})
		started := make(chan struct{})
		b := &batch.Batcher[int, int]{Lanes: 1, Run: func(ctx context.Context, items []int) ([]int, error) {
			switch calls.Add(1) {
			case 1:
				close(started)
				<-release
				return []int{0}, nil
			case 2:
				panic("run failed")
			}
			return make([]int, len(items)), nil
		}}
		ctx := context.Background()
		go b.Do(ctx, "k", 0)
		<-started
		var wg sync.WaitGroup
		var errs, panics atomic.Int64
		for i := range 5 {
			wg.Go(func() {
				defer func() {
					if recover() != nil {
						panics.Add(1)
					}
				}()
				if _, err := b.Do(ctx, "k", i); err != nil {
					errs.Add(1)
				}
			})
		}
		synctest.Wait() // every call is parked in Do
		close(release)
		wg.Wait()
		if panics.Load() != 1 || errs.Load() != 4 {
			t.Fatalf("%d panics, %d errors; want the runner to panic and the other 4 to fail", panics.Load(), errs.Load())
		}
		if _, err := b.Do(ctx, "k", 9); err != nil {
			t.Fatalf("the lane after the panic: %v", err)
		}
	})
}
