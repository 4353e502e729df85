package idem

import (
	"context"
	"time"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// Prune drops the stored responses older than h.Retention and the keys older than h.KeyLifetime, of final
// operations. A key whose response is gone still never runs again: a retry is answered 409
// idempotency_response_expired, naming the operation and its resource.
func (h *Handler) Prune(ctx context.Context) (responses, keys int64, err error) {
	return opstatus.PruneKeys(ctx, h.DB, h.retention(), h.keyLifetime())
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

func (h *Handler) retention() time.Duration {
	if h.Retention <= 0 {
		return DefaultRetention
	}
	return h.Retention
}

// keyLifetime is never shorter than the retention: a key outlives its response.
func (h *Handler) keyLifetime() time.Duration {
	if h.KeyLifetime <= 0 {
		return max(DefaultKeyLifetime, h.retention())
	}
	return max(h.KeyLifetime, h.retention())
}
