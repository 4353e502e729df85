// Package metricstest scrapes GET /metrics the way Prometheus does and reads values from it, so tests can check
// that counters moved by what the traffic they sent should cause.
//
//	before := metricstest.Scrape(t, c)
//	c.Post("/v1/tickets", body, apitest.Key(k))
//	after := metricstest.Scrape(t, c)
//	after.Delta(before, "retrysafe_idempotency_requests_total", "kind", "tickets.create", "outcome", "created") // 1
package metricstest

import (
	"bytes"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/retrysafe/retrysafe/internal/apitest"
)

// Sample is one scrape.
type Sample struct {
	Body     string
	families map[string]*dto.MetricFamily
}

// Scrape reads GET /metrics through c (so the answer is checked against api/openapi.yaml) and parses it.
func Scrape(t testing.TB, c *apitest.Client) Sample {
	t.Helper()
	res := c.As("").Get("/metrics").Status(t, http.StatusOK)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(res.Body))
	if err != nil {
		t.Fatalf("metricstest: /metrics is not the Prometheus text format: %v\n%s", err, res.Body)
	}
	return Sample{Body: string(res.Body), families: families}
}

// Has reports whether the scrape has a family called name.
func (s Sample) Has(name string) bool {
	_, ok := s.families[name]
	return ok
}

// Value sums the series of name whose labels include labelPairs ("kind", "tickets.create", ...): the value of
// a counter or gauge, the number of observations of a histogram. A series that is absent counts 0.
func (s Sample) Value(name string, labelPairs ...string) float64 {
	fam, ok := s.families[name]
	if !ok {
		return 0
	}
	var sum float64
	for _, m := range fam.GetMetric() {
		if !matches(m, labelPairs) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// Delta is s.Value minus before.Value.
func (s Sample) Delta(before Sample, name string, labelPairs ...string) float64 {
	return s.Value(name, labelPairs...) - before.Value(name, labelPairs...)
}

func matches(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
