package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"
)

// WatchOperations registers the gauges of unknown operations, read from db's operations table at each scrape
// (one indexed query, bounded by timeout): how many are unknown now, and for how long the oldest has been.
// They describe the database, so every process on it reports the same values: alert on max(), not sum().
func (m *Metrics) WatchOperations(db *gorm.DB, timeout time.Duration) {
	m.reg.MustRegister(&unknownOperations{db: db, timeout: timeout})
}

var (
	unknownDesc = prometheus.NewDesc("retrysafe_operations_unknown",
		"Operations whose outcome is unknown now (the recovery worker or a retry settles them).", nil, nil)
	oldestUnknownDesc = prometheus.NewDesc("retrysafe_operation_oldest_unknown_seconds",
		"How long the oldest unknown operation has been unknown (since its last state change); 0 when none is.", nil, nil)
)

type unknownOperations struct {
	db      *gorm.DB
	timeout time.Duration
}

func (u *unknownOperations) Describe(ch chan<- *prometheus.Desc) {
	ch <- unknownDesc
	ch <- oldestUnknownDesc
}

func (u *unknownOperations) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), u.timeout)
	defer cancel()
	var row struct {
		Count  int64
		Oldest float64
	}
	// operations_unknown is a partial index on updated_at WHERE state = 'unknown': this reads only those rows.
	err := u.db.WithContext(ctx).Raw(`
SELECT count(*) AS count, COALESCE(EXTRACT(EPOCH FROM now() - min(updated_at)), 0)::float8 AS oldest
FROM operations WHERE state = 'unknown'`).Scan(&row).Error
	if err != nil {
		err = fmt.Errorf("metrics: unknown operations: %w", err)
		ch <- prometheus.NewInvalidMetric(unknownDesc, err)
		ch <- prometheus.NewInvalidMetric(oldestUnknownDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(unknownDesc, prometheus.GaugeValue, float64(row.Count))
	ch <- prometheus.MustNewConstMetric(oldestUnknownDesc, prometheus.GaugeValue, max(row.Oldest, 0))
}
