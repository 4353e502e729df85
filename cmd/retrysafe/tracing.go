package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/retrysafe/retrysafe/pkg/tracing"
)

// setupTracing turns tracing on (pkg/tracing) when the OTEL_* variables ask for traces, naming the process
// service unless OTEL_SERVICE_NAME does: OTEL_TRACES_EXPORTER=otlp (OTLP over HTTP, configured by
// OTEL_EXPORTER_OTLP_*), or a set OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
// OTEL_TRACES_EXPORTER=console (spans as JSON on stderr). Unset, none, or OTEL_SDK_DISABLED=true leave it off.
// OTEL_RESOURCE_ATTRIBUTES and OTEL_TRACES_SAMPLER are read by the SDK as usual. The shutdown it returns
// flushes and stops; with tracing off it does nothing.
func setupTracing(ctx context.Context, getenv func(string) string, service string) (shutdown func(context.Context) error, err error) {
	nothing := func(context.Context) error { return nil }
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return nothing, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	if exporter == "" && (getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "") {
		exporter = "otlp"
	}
	var exp sdktrace.SpanExporter
	switch exporter {
	case "", "none":
		return nothing, nil
	case "otlp":
		if p := getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" {
			return nil, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_PROTOCOL=%q: only http/protobuf is built in", p)
		}
		exp, err = otlptracehttp.New(ctx)
	case "console":
		exp, err = stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
	default:
		return nil, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER=%q: want otlp, console or none", exporter)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", service)), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	tracing.Use(tp)
	return tp.Shutdown, nil
}
