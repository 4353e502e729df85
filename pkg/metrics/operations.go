package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// WatchOperations registers the gauges of unknown operations, read from db's operations table at each scrape
// (one indexed query, bounded by timeout): how many are unknown now, and for how long the oldest has been.
// They describe the database, so every process on it reports the same values: alert on max(), not sum().
func (m *Metrics) WatchOperations(db database.DBTX, timeout time.Duration) {
	m.reg.MustRegister(&countAndAge{count: unknownDesc, age: oldestUnknownDesc, what: "unknown operations", timeout: timeout,
		read: func(ctx context.Context) (int64, float64, error) {
			return opstore.UnknownCount(ctx, db)
		}})
}

var (
	unknownDesc = prometheus.NewDesc("retrysafe_operations_unknown",
		"Operations whose outcome is unknown now (the recovery worker or a retry settles them).", nil, nil)
	oldestUnknownDesc = prometheus.NewDesc("retrysafe_operation_oldest_unknown_seconds",
		"How long the oldest unknown operation has been unknown (since its last state change); 0 when none is.", nil, nil)
)

// countAndAge is a pair of gauges read from the database at each scrape, within timeout: how many of something
// there are now, and the age in seconds of the oldest (0 when there is none).
type countAndAge struct {
	count, age *prometheus.Desc
	what       string
	timeout    time.Duration
	read       func(ctx context.Context) (n int64, oldestSeconds float64, err error)
}

func (c *countAndAge) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.count
	ch <- c.age
}

func (c *countAndAge) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	n, age, err := c.read(ctx)
	if err != nil {
		err = fmt.Errorf("metrics: %s: %w", c.what, err)
		ch <- prometheus.NewInvalidMetric(c.count, err)
		ch <- prometheus.NewInvalidMetric(c.age, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, max(age, 0))
}
