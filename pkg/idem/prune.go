package idem

import (
	"context"
	"log/slog"
	"time"

	"gorm.io/gorm"
)

// Pruner deletes completed keys older than Retention, every Interval. Keys whose operation is running, queued
// or unknown are kept whatever their age: their outcome is still owed to the caller.
type Pruner struct {
	DB        *gorm.DB
	Retention time.Duration
	Interval  time.Duration
	Logger    *slog.Logger
}

// Run prunes until ctx ends.
func (p *Pruner) Run(ctx context.Context) {
	t := time.NewTicker(p.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := pruneKeys(ctx, p.DB, time.Now().Add(-p.Retention))
		if err != nil {
			if ctx.Err() == nil {
				p.log().WarnContext(ctx, "idempotency key pruning failed", "error", err.Error())
			}
			continue
		}
		if n > 0 {
			p.log().InfoContext(ctx, "idempotency keys pruned", "count", n, "retention", p.Retention.String())
		}
	}
}

func (p *Pruner) log() *slog.Logger {
	if p.Logger == nil {
		return slog.Default()
	}
	return p.Logger
}
