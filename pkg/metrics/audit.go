package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// WatchAudit registers the gauges of audit records not sealed yet, read from db at each scrape (audit.Pending:
// the records after the newest seal, by index, bounded by timeout): how many, and how old the oldest is. Like
// the unknown operations' gauges they describe the database: alert on max(), not sum().
func (m *Metrics) WatchAudit(db database.Pool, timeout time.Duration) {
	m.reg.MustRegister(&countAndAge{count: unsealedDesc, age: oldestUnsealedDesc, what: "unsealed audit records", timeout: timeout,
		read: func(ctx context.Context) (int64, float64, error) {
			n, oldest, err := audit.Pending(ctx, db)
			if err != nil || oldest.IsZero() {
				return n, 0, err
			}
			return n, time.Since(oldest).Seconds(), nil
		}})
}

var (
	unsealedDesc = prometheus.NewDesc("retrysafe_audit_unsealed_records",
		"Audit records not sealed yet (the sequencer seals them every AUDIT_SEAL_INTERVAL).", nil, nil)
	oldestUnsealedDesc = prometheus.NewDesc("retrysafe_audit_oldest_unsealed_seconds",
		"How long ago the oldest unsealed audit record was written; 0 when none is.", nil, nil)
)
