package metrics_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/metricstest"
	"github.com/retrysafe/retrysafe/internal/poll"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/metrics"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// serve puts m behind the shared router, with routes of its own, and returns a client of it.
func serve(t *testing.T, m *metrics.Metrics, routes func(r *gin.Engine)) *apitest.Client {
	t.Helper()
	r := httpserver.NewRouter(httpserver.Options{Logger: servicetest.Logger(), Middleware: []gin.HandlerFunc{httpserver.Metrics("things", m.Request)}})
	r.GET("/metrics", gin.WrapH(m.Handler()))
	routes(r)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return apitest.New(t, srv.URL, "")
}

func TestMiddlewareLabelsByRouteTemplate(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	c := serve(t, m, func(r *gin.Engine) {
		r.GET("/v1/things/:id", func(c *gin.Context) { c.Status(http.StatusNoContent) })
		r.GET("/v1/boom", func(c *gin.Context) { panic("boom") })
	})
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/things/thing_1"}, {"GET", "/v1/things/thing_2"}, {"GET", "/v1/boom"},
		{"GET", "/nowhere/thing_3"}, {"DELETE", "/v1/things/thing_4"}, {"BREW", "/v1/things/thing_5"},
	} {
		r, err := http.NewRequest(req.method, c.BaseURL+req.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	s := metricstest.Scrape(t, c)
	for _, tc := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"service", "things", "route", "/v1/things/:id", "method", "GET", "code", "204"}, 2},
		{[]string{"route", "/v1/boom", "code", "500"}, 1}, // a panic is counted as the 500 it becomes
		{[]string{"route", metrics.UnmatchedRoute, "method", "GET", "code", "404"}, 1},
		{[]string{"route", metrics.UnmatchedRoute, "method", "DELETE", "code", "405"}, 1},
		{[]string{"route", metrics.UnmatchedRoute, "method", "other"}, 1}, // invented methods add no series
	} {
		if got := s.Value("retrysafe_http_requests_total", tc.labels...); got != tc.want {
			t.Errorf("retrysafe_http_requests_total%v = %v; want %v", tc.labels, got, tc.want)
		}
	}
	if strings.Contains(s.Body, "thing_") || strings.Contains(s.Body, "BREW") {
		t.Errorf("a raw path or method became a label:\n%s", s.Body)
	}
}

// TestMiddlewareOnNetHTTP: around a ServeMux, requests are labelled by the path of the pattern that answered,
// the status the handler wrote (200 when it wrote none), and unmatched ones as UnmatchedRoute.
func TestMiddlewareOnNetHTTP(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /v1/things/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "thing_2" {
			w.WriteHeader(http.StatusNoContent)
		}
	})
	srv := httptest.NewServer(m.Middleware("things")(mux))
	t.Cleanup(srv.Close)
	c := apitest.New(t, srv.URL, "")
	for _, path := range []string{"/v1/things/thing_1", "/v1/things/thing_2", "/nowhere/thing_3"} {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	s := metricstest.Scrape(t, c)
	for _, tc := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"service", "things", "route", "/v1/things/{id}", "method", "GET", "code", "200"}, 1},
		{[]string{"route", "/v1/things/{id}", "code", "204"}, 1},
		{[]string{"route", metrics.UnmatchedRoute, "method", "GET", "code", "404"}, 1},
	} {
		if got := s.Value("retrysafe_http_requests_total", tc.labels...); got != tc.want {
			t.Errorf("retrysafe_http_requests_total%v = %v; want %v", tc.labels, got, tc.want)
		}
	}
	if strings.Contains(s.Body, "thing_") {
		t.Errorf("a raw path became a label:\n%s", s.Body)
	}
}

func TestObserversCount(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	c := serve(t, m, func(*gin.Engine) {})
	var observer idem.Observer = m
	observer.IdempotencyOutcome("things.create", idem.Outcome("in_progress"))
	observer.IdempotencyOutcome("things.create", idem.Outcome("store_unavailable"))
	opstatus.ObserveFinished(m, "things.create", opstatus.StateFailed)
	opstatus.ObserveFinished(m, "things.create", opstatus.StateQueued) // not final: not counted
	m.Reconciled("things.create", opstatus.ReconcileError)
	m.Downstream("target")("refused", 20*time.Millisecond)
	s := metricstest.Scrape(t, c)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"retrysafe_idempotency_requests_total", []string{"outcome", "in_progress"}, 1},
		{"retrysafe_idempotency_requests_total", []string{"outcome", "store_unavailable"}, 1},
		{"retrysafe_operations_finished_total", []string{"kind", "things.create", "state", "failed"}, 1},
		{"retrysafe_operations_finished_total", nil, 1},
		{"retrysafe_reconcile_total", []string{"kind", "things.create", "result", "error"}, 1},
		{"retrysafe_downstream_request_duration_seconds", []string{"target", "target", "outcome", "refused"}, 1},
	} {
		if got := s.Value(tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %v; want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

func TestUnknownOperationGauges(t *testing.T) {
	t.Parallel()
	tx := testdb.Tx(t)
	ctx := t.Context()
	m := metrics.New()
	m.WatchOperations(database.SQL(tx), 2*time.Second)
	c := serve(t, m, func(*gin.Engine) {})
	if s := metricstest.Scrape(t, c); s.Value("retrysafe_operations_unknown") != 0 || !s.Has("retrysafe_operation_oldest_unknown_seconds") {
		t.Fatalf("with no operations: unknown %v, oldest present %v; want 0 and present",
			s.Value("retrysafe_operations_unknown"), s.Has("retrysafe_operation_oldest_unknown_seconds"))
	}
	for i := range 3 {
		op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct_gauge", Kind: "things.create", State: opstatus.StateRunning,
			IdempotencyKey: fmt.Sprintf("k%d", i), Fingerprint: "fp"}
		testdb.CreateOperation(t, tx, op)
		if i == 2 {
			continue // still running: not unknown
		}
		if _, err := opstatus.Transition(ctx, database.SQL(tx), op.AccountID, op.ID, opstatus.StateUnknown, "test"); err != nil {
			t.Fatal(err)
		}
	}
	s := metricstest.Scrape(t, c)
	if got := s.Value("retrysafe_operations_unknown"); got != 2 {
		t.Errorf("retrysafe_operations_unknown = %v; want 2", got)
	}
	if got := s.Value("retrysafe_operation_oldest_unknown_seconds"); got < 0 {
		t.Errorf("retrysafe_operation_oldest_unknown_seconds = %v; want >= 0", got)
	}
	if strings.Contains(s.Body, "acct_gauge") {
		t.Error("an account reached /metrics")
	}
}

// TestUnsealedRecordGauges: records just written are counted until the sequencer seals them.
func TestUnsealedRecordGauges(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	m := metrics.New()
	m.WatchAudit(db.Pool, 2*time.Second)
	c := serve(t, m, func(*gin.Engine) {})
	if s := metricstest.Scrape(t, c); s.Value("retrysafe_audit_unsealed_records") != 0 || s.Value("retrysafe_audit_oldest_unsealed_seconds") != 0 {
		t.Fatalf("with no records: %v unsealed, oldest %v s; want 0 and 0", s.Value("retrysafe_audit_unsealed_records"),
			s.Value("retrysafe_audit_oldest_unsealed_seconds"))
	}
	for i := range 3 {
		testdb.CreateOperation(t, db.DB, opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct_gauge", Kind: "things.create",
			State: opstatus.StateRunning, IdempotencyKey: fmt.Sprintf("k%d", i), Fingerprint: "fp"})
	}
	s := metricstest.Scrape(t, c)
	if got := s.Value("retrysafe_audit_unsealed_records"); got != 3 {
		t.Errorf("retrysafe_audit_unsealed_records = %v; want 3", got)
	}
	if !s.Has("retrysafe_audit_oldest_unsealed_seconds") || s.Value("retrysafe_audit_oldest_unsealed_seconds") < 0 {
		t.Errorf("retrysafe_audit_oldest_unsealed_seconds = %v; want present, >= 0", s.Value("retrysafe_audit_oldest_unsealed_seconds"))
	}
	seq := &audit.Sequencer{DB: db.Pool}
	poll.Until(t, "retrysafe_audit_unsealed_records at 0", func() bool {
		if _, err := seq.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		return metricstest.Scrape(t, c).Value("retrysafe_audit_unsealed_records") == 0
	})
	if got := metricstest.Scrape(t, c).Value("retrysafe_audit_oldest_unsealed_seconds"); got != 0 {
		t.Errorf("retrysafe_audit_oldest_unsealed_seconds = %v once sealed; want 0", got)
	}
}

// TestScrapeSurvivesAnUnreachableDatabase: the gauges that need the database drop out, the rest is served.
func TestScrapeSurvivesAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	db, err := gorm.Open(postgres.Open("postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=1"),
		&gorm.Config{Logger: gormlogger.Discard, DisableAutomaticPing: true})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	m.WatchOperations(database.SQL(db), time.Second)
	c := serve(t, m, func(*gin.Engine) {})
	m.IdempotencyOutcome("things.create", idem.Outcome("created"))
	s := metricstest.Scrape(t, c)
	if s.Has("retrysafe_operations_unknown") {
		t.Error("retrysafe_operations_unknown served without a database")
	}
	if s.Value("retrysafe_idempotency_requests_total") != 1 {
		t.Error("the counters were not served when the database was unreachable")
	}
}
