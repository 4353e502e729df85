// Package servicetest builds a service under test exactly as `retrysafe serve` does, through the contract of
// internal/service: the demo API keys, an idem.Handler on a lent test schema, service.Handler in front, the
// service's reconcilers given to idem, and an httptest server.
//
//	env := servicetest.New(t)
//	svc, err := tickets.New(env.Deps, tickets.Config{})
//	agent := env.Serve(t, svc) // an apitest.Client as the demo agent
package servicetest

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/faultproxy"
	"github.com/retrysafe/retrysafe/internal/poll"
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/clock"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// The demo secrets of auth.DemoKeys.
const (
	AgentSecret         = "demo-agent-secret"
	ApproverSecret      = "demo-approver-secret"
	OtherAgentSecret    = "other-agent-secret"
	OtherApproverSecret = "other-approver-secret"
	AccountDemo         = "acct_demo"
	AccountOther        = "acct_other"
)

var defaultLogger sync.Once

// Env is one service under test.
type Env struct {
	Deps service.Deps
	// DB is the lent schema, reached directly: tests assert rows through it even while the service's own
	// connections are cut.
	DB *testdb.DB
	// ServiceDB is the pool the service runs on (Deps.DB, Idem.DB): DB itself, or with ThroughProxy a pool that
	// reaches the same schema through Proxy.
	ServiceDB *gorm.DB
	Proxy     *faultproxy.Proxy
	Idem      *idem.Handler
	Logger    *slog.Logger
	Keys      *auth.Keys
	URL       string
	// Clock is Idem's: a test moves it past a lease or a retention instead of sleeping (pkg/clock).
	Clock *clock.Clock
}

// Option changes how New assembles the service's dependencies.
type Option func(t testing.TB, e *Env)

// ThroughProxy makes the service reach its schema through a faultproxy (env.Proxy), on a pool with the bounds
// of o, so a test can cut, refuse or stall the service's database while it runs.
func ThroughProxy(o database.Options) Option {
	return func(t testing.TB, e *Env) {
		u, err := url.Parse(e.DB.DSN)
		if err != nil {
			t.Fatal(err)
		}
		e.Proxy = faultproxy.Start(t, u.Host)
		if o.MaxConns == 0 {
			o.MaxConns = 6
		}
		db, err := database.Open(e.Proxy.DSN(e.DB.DSN), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if sqlDB, err := db.DB(); err == nil {
				sqlDB.Close()
			}
		})
		e.ServiceDB = db
	}
}

// GormDefaults makes the service's pool one opened as an adopter opens gorm: gorm.Open(postgres.Open(dsn),
// &gorm.Config{}), its default transaction on.
func GormDefaults() Option {
	return func(t testing.TB, e *Env) {
		db, err := gorm.Open(postgres.Open(e.DB.DSN), &gorm.Config{Logger: gormlogger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if sqlDB, err := db.DB(); err == nil {
				sqlDB.Close()
			}
		})
		e.ServiceDB = db
	}
}

// New prepares the dependencies of a service on a fresh schema; build the service from env.Deps, then Serve it.
func New(t testing.TB, opts ...Option) *Env {
	t.Helper()
	db := testdb.Schema(t)
	logger := Logger()
	defaultLogger.Do(func() { slog.SetDefault(logger) })
	keys := auth.Demo()
	e := &Env{DB: db, ServiceDB: db.DB, Logger: logger, Keys: keys, Clock: &clock.Clock{}}
	for _, opt := range opts {
		opt(t, e)
	}
	e.Idem = &idem.Handler{DB: e.ServiceDB, Logger: logger, Lease: 5 * time.Second, RetryAfter: 1, Clock: e.Clock}
	pool, err := database.PoolOf(e.ServiceDB)
	if err != nil {
		t.Fatal(err)
	}
	e.Deps = service.Deps{DB: e.ServiceDB, Pool: pool, Idem: e.Idem, Logger: logger}
	return e
}

// Serve wires svc as `retrysafe serve` does (service.Handler; its reconcilers given to the idem.Handler) and
// serves it until the test ends. It returns a client as the demo agent.
func (e *Env) Serve(t testing.TB, svc service.Service) *apitest.Client {
	t.Helper()
	return e.ServeHTTP(t, service.HTTP{Keys: e.Keys}, svc)
}

// ServeHTTP is Serve with the shared HTTP stack h (keys, body limit, rate limits) as cmd/retrysafe builds it;
// its Keys default to the demo keys.
func (e *Env) ServeHTTP(t testing.TB, h service.HTTP, svc service.Service) *apitest.Client {
	t.Helper()
	if h.Keys == nil {
		h.Keys = e.Keys
	}
	e.Idem.Reconcilers = service.Reconcilers(svc)
	srv := httptest.NewServer(service.Handler(e.Deps, h, svc))
	t.Cleanup(srv.Close)
	e.URL = srv.URL
	return apitest.New(t, srv.URL, AgentSecret)
}

// RunWorkers runs what `retrysafe serve` runs in the background for svcs (their workers; recovery and pruning
// when b sets their intervals) until the test ends. Its cleanup is registered after the schema's, so the
// workers stop before the schema is lent again.
func (e *Env) RunWorkers(t testing.TB, b service.Background, svcs ...service.Service) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	wait := service.Start(ctx, service.Workers(e.Deps, b, svcs...))
	t.Cleanup(func() { cancel(); wait() })
}

// Routes is a service made of routes alone, for tests of the mechanisms under pkg/.
type Routes func(api gin.IRouter)

var _ service.Service = Routes(nil)

func (r Routes) Name() string                                { return "test" }
func (r Routes) Routes(api gin.IRouter)                      { r(api) }
func (r Routes) Reconcilers() map[string]opstatus.Reconciler { return nil }
func (r Routes) Workers() []service.Worker                   { return nil }

// Logger discards logs unless TEST_LOG=1.
func Logger() *slog.Logger {
	if os.Getenv("TEST_LOG") == "1" {
		return slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewJSONHandler(io.Discard, nil))
}

// Eventually polls cond until it holds (poll.Until). It is a synchronisation point with another goroutine or
// process (a worker, a restarted server), never a timing assertion.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, cond)
}

// AuditIntact runs `retrysafe audit verify`'s check over db and fails the test unless every chain is intact.
func AuditIntact(t testing.TB, db *gorm.DB) {
	t.Helper()
	if err := testdb.AuditIntact(db); err != nil {
		t.Fatal(err)
	}
}
