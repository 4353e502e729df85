package idem

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// Background configures RunBackground. A zero interval is the default; a negative one leaves that work out (a
// test that drives it by hand, or a process where another component runs it).
type Background struct {
	// PruneInterval: how often responses past Retention and keys past KeyLifetime are pruned (10 minutes).
	PruneInterval time.Duration
	// RecoveryInterval: how often operations whose lease ran out are handed to their kind's Reconciler
	// (Handler.Reconcilers); without it an external write whose process died stays running (5 seconds).
	RecoveryInterval time.Duration
	// SealInterval: how often new audit records are sealed (audit.Sequencer), signed by Signer when set (1
	// second: a record is tamper-evident from then).
	SealInterval time.Duration
	Signer       *auditchain.Signer
}

// RunBackground runs the work a process serving h must run beside its requests until ctx ends: pruning, lease
// recovery and audit sealing. Every replica may run it; they share the work safely. A handler that answers
// requests while it is not running says so once in its log and through Observer.BackgroundRunning.
func (h *Handler) RunBackground(ctx context.Context, b Background) {
	h.backgroundRunning(true)
	defer h.backgroundRunning(false)
	var wg sync.WaitGroup
	if every := cmp.Or(b.PruneInterval, 10*time.Minute); every > 0 {
		wg.Go(func() { h.runPruner(ctx, every) })
	}
	if every := cmp.Or(b.RecoveryInterval, 5*time.Second); every > 0 {
		w := &opstatus.RecoveryWorker{DB: database.SQL(h.DB), Reconcilers: h.Reconcilers, Interval: every, Logger: h.log(),
			Observer: h.OperationObserver(), Clock: h.Clock}
		wg.Go(func() { w.Run(ctx) })
	}
	if every := cmp.Or(b.SealInterval, audit.DefaultSealInterval); every > 0 {
		pool, err := database.PoolOf(h.DB)
		if err != nil {
			h.log().ErrorContext(ctx, "audit records are not sealed", "error", err.Error())
		} else {
			w := &audit.Sequencer{DB: pool, Signer: b.Signer, Interval: every, Logger: h.log()}
			wg.Go(func() { w.Run(ctx) })
		}
	}
	wg.Wait()
}

func (h *Handler) backgroundRunning(running bool) {
	h.background.Store(running)
	if h.Observer != nil {
		h.Observer.BackgroundRunning(running)
	}
}

// checkBackground warns, once, when h answers a write while RunBackground is not running.
func (h *Handler) checkBackground() {
	if h.background.Load() {
		return
	}
	h.backgroundWarned.Do(func() {
		h.log().Warn("idem: the handler serves writes but its background work is not running: keys are never pruned, " +
			"operations whose process died stay running, the audit is never sealed; call Handler.RunBackground at start")
		if h.Observer != nil {
			h.Observer.BackgroundRunning(false)
		}
	})
}

// Prune drops the stored responses older than h.Retention and the keys older than h.KeyLifetime, of final
// operations. A key whose response is gone still never runs again: a retry is answered 409
// idempotency_response_expired, naming the operation and its resource.
func (h *Handler) Prune(ctx context.Context) (responses, keys int64, err error) {
	now := h.Clock.Now()
	return opstore.Prune(ctx, database.SQL(h.DB), now.Add(-h.retention()), now.Add(-h.keyLifetime()), h.Clock.NowOrNil())
}

// runPruner prunes every interval until ctx ends (RunBackground).
func (h *Handler) runPruner(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		responses, keys, err := h.Prune(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			h.log().WarnContext(ctx, "idempotency key pruning failed", "error", err.Error())
		case responses > 0 || keys > 0:
			h.log().InfoContext(ctx, "idempotency keys pruned", "responses", responses, "keys", keys,
				"retention", h.retention().String(), "key_lifetime", h.keyLifetime().String())
		}
	}
}
