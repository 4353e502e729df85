// Package servicetest assembles a service under test the way cmd/retrysafe does: the shared router, the demo
// API keys, an idem.Handler on a lent test schema, and an httptest server in front.
//
//	env := servicetest.New(t)
//	tickets.Routes(env.API, &tickets.Server{DB: env.DB.DB, Store: tickets.PostgresStore{}, Idem: env.Idem})
//	agent := env.Start(t) // an apitest.Client as the demo agent
package servicetest

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
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
	DB     *testdb.DB
	Engine *gin.Engine
	API    *gin.RouterGroup
	Idem   *idem.Handler
	Logger *slog.Logger
	Keys   *auth.Keys
	URL    string
}

// New prepares a router on a fresh schema; register routes on env.API, then call Start.
func New(t testing.TB) *Env {
	t.Helper()
	db := testdb.Schema(t)
	logger := Logger()
	defaultLogger.Do(func() { slog.SetDefault(logger) })
	keys, err := auth.ParseKeys(auth.DemoKeys)
	if err != nil {
		t.Fatal(err)
	}
	r := httpserver.NewRouter(httpserver.Options{Logger: logger, DB: db.DB})
	return &Env{
		DB: db, Engine: r, API: r.Group("", auth.Middleware(keys)), Logger: logger, Keys: keys,
		Idem: &idem.Handler{DB: db.DB, Store: idem.PostgresStore{}, Logger: logger, Lease: 5 * time.Second, RetryAfter: 1},
	}
}

// Start serves the router and returns a client as the demo agent.
func (e *Env) Start(t testing.TB) *apitest.Client {
	t.Helper()
	srv := httptest.NewServer(e.Engine)
	t.Cleanup(srv.Close)
	e.URL = srv.URL
	return apitest.New(t, srv.URL, AgentSecret)
}

// Logger discards logs unless TEST_LOG=1.
func Logger() *slog.Logger {
	if os.Getenv("TEST_LOG") == "1" {
		return slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewJSONHandler(io.Discard, nil))
}

// Eventually polls cond until it holds, failing the test after 30 s. It is a synchronisation point with another
// goroutine or process (a worker, a restarted server), never a timing assertion.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within 30s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
