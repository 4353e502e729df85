package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/tracing"
)

// TestTracingConfig: an OTEL_TRACES_EXPORTER the program cannot honour is a configuration error before anything
// is opened (exit 2), as any bad variable is; none, or nothing set, leaves tracing off.
func TestTracingConfig(t *testing.T) {
	t.Parallel()
	for _, vars := range []map[string]string{
		{"OTEL_TRACES_EXPORTER": "zipkin"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
	} {
		err := run(context.Background(), []string{"migrate"}, env(vars), &bytes.Buffer{})
		if exitCode(err) != 2 {
			t.Errorf("%v: %v (exit %d); want a configuration error, exit 2", vars, err, exitCode(err))
		}
	}
	for _, vars := range []map[string]string{{}, {"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}} {
		shutdown, err := setupTracing(context.Background(), env(vars), "test")
		if err != nil {
			t.Errorf("%v: %v; want tracing left off", vars, err)
			continue
		}
		_ = shutdown(context.Background())
		if tracing.Enabled() {
			t.Fatalf("%v turned tracing on", vars)
		}
	}
}
