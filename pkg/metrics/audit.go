package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/audit"
)

// WatchAudit registers the gauges of audit records not sealed yet, read from db at each scrape (audit.Pending:
// the records after the newest seal, by index, bounded by timeout): how many, and how old the oldest is. Like
// the unknown operations' gauges they describe the database: alert on max(), not sum().
func (m *Metrics) WatchAudit(db *gorm.DB, timeout time.Duration) {
	m.reg.MustRegister(&unsealedRecords{db: db, timeout: timeout})
}

var (
	unsealedDesc = prometheus.NewDesc("retrysafe_audit_unsealed_records",
		"Audit records not sealed yet (the sequencer seals them every AUDIT_SEAL_INTERVAL).", nil, nil)
	oldestUnsealedDesc = prometheus.NewDesc("retrysafe_audit_oldest_unsealed_seconds",
		"How long ago the oldest unsealed audit record was written; 0 when none is.", nil, nil)
)

type unsealedRecords struct {
	db      *gorm.DB
	timeout time.Duration
}

func (u *unsealedRecords) Describe(ch chan<- *prometheus.Desc) {
	ch <- unsealedDesc
	ch <- oldestUnsealedDesc
}

func (u *unsealedRecords) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), u.timeout)
	defer cancel()
	n, oldest, err := audit.Pending(ctx, u.db)
	if err != nil {
		err = fmt.Errorf("metrics: unsealed audit records: %w", err)
		ch <- prometheus.NewInvalidMetric(unsealedDesc, err)
		ch <- prometheus.NewInvalidMetric(oldestUnsealedDesc, err)
		return
	}
	age := 0.0
	if !oldest.IsZero() {
		age = max(time.Since(oldest).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(unsealedDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(oldestUnsealedDesc, prometheus.GaugeValue, age)
}
