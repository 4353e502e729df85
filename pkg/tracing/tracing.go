// Package tracing follows one action across processes with OpenTelemetry: the agent, the service and the
// payment provider carry a W3C traceparent, and each records spans of what it did (the agent's attempt, the
// service's request, idem's claim, write, dispatch and completion, the provider's call).
//
// It is off by default and then costs one atomic load per would-be span: Start hands back the context as it
// is, Request, Handler and Transport pass straight through. Use turns it on with a TracerProvider; the package needs
// only the OpenTelemetry API, and the program picks the SDK and its exporter (cmd/retrysafe reads the standard
// OTEL_* variables):
//
//	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
//	tracing.Use(tp)
//	defer tp.Shutdown(context.Background()) // flushes the spans not yet exported
package tracing

import (
	"context"
	"net/http"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// instrumentation names the spans' source.
const instrumentation = "github.com/retrysafe/retrysafe"

var (
	on         atomic.Bool
	propagator = propagation.TraceContext{}
)

// Enabled reports whether spans are recorded and traceparent sent.
func Enabled() bool { return on.Load() }

// Use turns tracing on with tp: Setup's provider, or a test's with an in-memory exporter.
func Use(tp trace.TracerProvider) {
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagator)
	on.Store(true)
}

// Start starts a span named name as a child of ctx's; with tracing off it returns ctx and its (non-recording)
// span, allocating nothing.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !on.Load() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return otel.Tracer(instrumentation).Start(ctx, name, trace.WithAttributes(attrs...))
}

// Inject writes ctx's span as a traceparent header into h (nothing with tracing off).
func Inject(ctx context.Context, h http.Header) {
	if on.Load() {
		propagator.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// Extract is ctx with the remote span h's traceparent names, if any.
func Extract(ctx context.Context, h http.Header) context.Context {
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Parent is ctx with traceparent (as Inject writes it) as its remote parent: a resumed action's spans join the
// trace its first attempt began, in whatever process.
func Parent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return Extract(ctx, http.Header{"Traceparent": {traceparent}})
}

// TraceParent is ctx's span as a traceparent value, "" with tracing off.
func TraceParent(ctx context.Context) string {
	h := http.Header{}
	Inject(ctx, h)
	return h.Get("Traceparent")
}

// Request starts the server span of r, a child of the caller's traceparent, named name (method and route
// template); done records the status of the answer, when it is known (not 0), and ends the span. A router's
// adapter calls it once it knows the route (pkg/httpserver's Tracing for gin). With tracing off it returns r's
// context and a done that does nothing.
func Request(r *http.Request, name string) (ctx context.Context, done func(status int)) {
	if !on.Load() {
		return r.Context(), noDone
	}
	ctx, span := otel.Tracer(instrumentation).Start(Extract(r.Context(), r.Header), name,
		trace.WithSpanKind(trace.SpanKindServer))
	return ctx, func(status int) {
		if status != 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", status))
		}
		span.End()
	}
}

func noDone(int) {}

// Handler is a server span per request to next, named by method and path, for a net/http server without
// route templates (the payment provider sandbox).
func Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !on.Load() {
			next.ServeHTTP(w, r)
			return
		}
		ctx, span := otel.Tracer(instrumentation).Start(Extract(r.Context(), r.Header), r.Method+" "+r.URL.Path,
			trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// Transport sends each request's span as traceparent, in a client span of its own.
func Transport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripper{next}
}

type roundTripper struct{ next http.RoundTripper }

func (t roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	if !on.Load() {
		return t.next.RoundTrip(r)
	}
	ctx, span := otel.Tracer(instrumentation).Start(r.Context(), r.Method+" "+r.URL.Host, trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	r = r.Clone(ctx)
	Inject(ctx, r.Header)
	res, err := t.next.RoundTrip(r)
	if err == nil {
		span.SetAttributes(attribute.Int("http.response.status_code", res.StatusCode))
	}
	return res, err
}
