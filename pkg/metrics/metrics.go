// Package metrics exposes what the retrysafe services do as Prometheus metrics: HTTP requests by route
// template, idempotency decisions, finished and unknown operations, reconciles and downstream calls.
//
// One Metrics per process, on its own registry (never the global default one, so tests can build several in one
// process). It implements idem.Observer and opstatus.Observer. cmd/retrysafe wires it through internal/service,
// which counts every request of each service's router and serves Handler on GET /metrics:
//
//	m := metrics.New()
//	m.WatchOperations(db, 2*time.Second) // the gauges of unknown operations
//	d := service.Deps{DB: db, Logger: logger, Metrics: m,
//		Idem: &idem.Handler{DB: db, Observer: m}}
//	client := provider.NewClient(url, secret, timeout).WithObserver(m.Downstream("provider"))
//
// On net/http: mux.Handle("GET /metrics", m.Handler()) and http.ListenAndServe(addr, m.Middleware("tickets")(mux)).
// On gin: httpserver.Options{Middleware: []gin.HandlerFunc{httpserver.Metrics("tickets", m.Request)}} and
// r.GET("/metrics", gin.WrapH(m.Handler())).
//
// Labels never carry an account, a key, an id or a raw path: only kinds, route templates, states and outcomes
// from fixed lists, so the number of series stays bounded whatever callers send.
package metrics

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/felixge/httpsnoop"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// UnmatchedRoute is the route label of a request that matched no route (404, 405): the raw path never
// becomes a label.
const UnmatchedRoute = "unmatched"

// Metrics is the metrics of one process.
type Metrics struct {
	reg          *prometheus.Registry
	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	idempotency  *prometheus.CounterVec
	background   prometheus.Gauge
	finished     *prometheus.CounterVec
	reconciles   *prometheus.CounterVec
	downstream   *prometheus.HistogramVec
}

var (
	_ idem.Observer     = (*Metrics)(nil)
	_ opstatus.Observer = (*Metrics)(nil)
)

// New returns the metrics of a process on a registry of its own, with the Go runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "retrysafe_http_requests_total",
			Help: "HTTP requests answered, by service, route template, method and status code.",
		}, []string{"service", "route", "method", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "retrysafe_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by service, route template and method.",
			Buckets: prometheus.DefBuckets,
		}, []string{"service", "route", "method"}),
		idempotency: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "retrysafe_idempotency_requests_total",
			Help: "Idempotent writes by operation kind and outcome: created, replayed, conflict, in_progress, unknown, refused, store_unavailable, unkeyed.",
		}, []string{"kind", "outcome"}),
		background: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "retrysafe_background_running",
			Help: "1 while the idempotency handler's background work (idem.Handler.RunBackground: pruning, lease recovery, audit sealing) runs; 0 when it does not.",
		}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "retrysafe_operations_finished_total",
			Help: "Operations this process moved to a final state (succeeded, failed, cancelled), by kind and state.",
		}, []string{"kind", "state"}),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "retrysafe_reconcile_total",
			Help: "Reconcilers asked to settle an unknown operation (recovery worker or a retry), by kind and result: settled, still_unknown, error.",
		}, []string{"kind", "result"}),
		downstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "retrysafe_downstream_request_duration_seconds",
			Help:    "Calls to systems outside the process (the payment provider, the deploy target), by target and outcome: ok, refused, unknown.",
			Buckets: prometheus.DefBuckets,
		}, []string{"target", "outcome"}),
	}
	m.reg.MustRegister(m.httpRequests, m.httpDuration, m.idempotency, m.background, m.finished, m.reconciles, m.downstream,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the process's registry, for collectors of its own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text format. A collector that fails (the database did not
// answer the operations query in time) drops its own series and is logged; the others are still served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Request counts and times one answered request of service: route is its route template ("" when it matched
// no route: UnmatchedRoute), status the status of the answer. Middleware calls it on net/http, and
// pkg/httpserver's Metrics on gin.
func (m *Metrics) Request(service, route, method string, status int, took time.Duration) {
	if route == "" {
		route = UnmatchedRoute
	}
	method = methodLabel(method)
	m.httpRequests.WithLabelValues(service, route, method, strconv.Itoa(status)).Inc()
	m.httpDuration.WithLabelValues(service, route, method).Observe(took.Seconds())
}

// Middleware counts and times every request of service on net/http. The route is the path of the ServeMux
// pattern that answered ("/v1/things/{id}"), which the mux sets on the request it is given: put Middleware
// directly around the mux, with nothing between them that passes on a copy of the request.
func (m *Metrics) Middleware(service string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got := httpsnoop.CaptureMetrics(next, w, r)
			m.Request(service, routeOf(r.Pattern), r.Method, got.Code, got.Duration)
		})
	}
}

// routeOf is the path of a ServeMux pattern: "GET /v1/things/{id}" is /v1/things/{id}, as the method has a
// label of its own.
func routeOf(pattern string) string {
	if _, path, ok := strings.Cut(pattern, " "); ok {
		return path
	}
	return pattern
}

// methodLabel keeps the method label to the standard methods: a caller inventing methods cannot add series.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodOptions:
		return method
	}
	return "other"
}

// IdempotencyOutcome implements idem.Observer.
func (m *Metrics) IdempotencyOutcome(kind string, outcome idem.Outcome) {
	m.idempotency.WithLabelValues(kind, string(outcome)).Inc()
}

// BackgroundRunning implements idem.Observer.
func (m *Metrics) BackgroundRunning(running bool) {
	v := 0.0
	if running {
		v = 1
	}
	m.background.Set(v)
}

// OperationFinished implements opstatus.Observer.
func (m *Metrics) OperationFinished(kind string, state opstatus.State) {
	m.finished.WithLabelValues(kind, string(state)).Inc()
}

// Reconciled implements opstatus.Observer.
func (m *Metrics) Reconciled(kind string, result opstatus.ReconcileResult) {
	m.reconciles.WithLabelValues(kind, string(result)).Inc()
}

// Downstream returns the observer of calls to target ("provider", "deploy_target"), in the shape the provider
// client (WithObserver) and deploys.ObserveTarget take; nil, which they take as none, when m is nil.
func (m *Metrics) Downstream(target string) func(outcome string, d time.Duration) {
	if m == nil {
		return nil
	}
	return func(outcome string, d time.Duration) {
		m.downstream.WithLabelValues(target, outcome).Observe(d.Seconds())
	}
}
