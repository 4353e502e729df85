// Package service is the contract every demo service of this module (services/) follows, and the one place that
// turns services into running gin handlers and background work. cmd/retrysafe and the tests call the same functions, so a service
// under test is wired exactly as `retrysafe serve` wires it.
//
// A service package has a Config (validated by its New), and New(deps, cfg) returns a value with:
//
//   - Name, the name `retrysafe serve NAME` knows it by;
//   - Routes, which registers every endpoint on the authenticated group (in the service's routes.go);
//   - Reconcilers, by operation kind, which settle the service's unknown operations;
//   - Workers, its background loops (the deploy controller), run until their context ends;
//   - optionally ConsolePages, the pages it adds to its browser console (pkg/console), which Handler serves
//     at /console on every service.
//
// Then:
//
//	svc, err := tickets.New(deps, tickets.Config{})
//	engine := service.Handler(deps, service.HTTP{Keys: keys}, svc)
//	recon := service.Reconcilers(svc)       // also given to deps.Idem, so a retry settles an unknown operation
//	err = service.RunWorkers(ctx, deps, service.Background{...}, svc)
package service

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/console"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/metrics"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/ratelimit"
	"github.com/retrysafe/retrysafe/pkg/resolution"
)

// Deps is what every service is built from: the database, the idempotency handler every write goes through,
// the logger and the process's metrics.
type Deps struct {
	DB *gorm.DB
	// Pool is DB as the library's packages take it (database.PoolOf(DB)).
	Pool   database.Pool
	Idem   *idem.Handler
	Logger *slog.Logger
	// Metrics, when set, counts every request (Handler serves it on GET /metrics) and downstream call; give it
	// to Idem.Observer too. Nil means no metrics.
	Metrics *metrics.Metrics
	// Resolvers are the resolution.Resolvers of every service of the process (service.Resolvers), so that a
	// person's decision sent to any service's POST /v1/operations/{id}/resolution releases what the operation
	// held, whichever service owns it. Handler adds the served service's own.
	Resolvers map[string]resolution.Resolver
	// Services are the names of every service of the process, so that a decision sent to any of them on an
	// operation of another is refused naming where to send it (resolution.Resolve). Handler adds the served
	// service's own.
	Services []string
}

// Log returns d.Logger, or a logger that discards when it is nil.
func (d Deps) Log() *slog.Logger {
	if d.Logger == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return d.Logger
}

// Service is one retrysafe service.
type Service interface {
	Name() string
	// Routes registers every endpoint of the service on api, which is behind auth.Middleware.
	Routes(api gin.IRouter)
	// Reconcilers settle the service's unknown operations, by operation kind.
	Reconcilers() map[string]opstatus.Reconciler
	// Workers are the service's background loops; each returns once ctx ends.
	Workers() []Worker
}

// OperationResolvers is implemented by a service whose unknown operations hold something (a payment's
// reservation, a deploy's environment lock) that a person's decision must release, by operation kind.
type OperationResolvers interface {
	Resolvers() map[string]resolution.Resolver
}

// ConsolePages is implemented by a service that adds pages to its console (deploys: its environments).
type ConsolePages interface {
	ConsolePages() []console.Page
}

// Worker is a named background loop.
type Worker struct {
	Name string
	Run  func(ctx context.Context)
}

// HTTP is the shared HTTP stack of a service.
type HTTP struct {
	Keys *auth.Keys
	// BodyLimit caps request bodies (httpserver's default when zero).
	BodyLimit int64
	// Ready, when set, is an extra readiness check (pending migrations).
	Ready func(ctx context.Context) error
	// Middleware runs before authentication on every route, health endpoints included.
	Middleware []gin.HandlerFunc
	// WriteLimiter, when set, limits each account's writes (429 rate_limited); share one between the services
	// of a process.
	WriteLimiter *ratelimit.Limiter
	// AuthFailures, when set, throttles the clients whose keys or sign-ins are refused (429 rate_limited), on
	// the API and the console; share one between the services of a process.
	AuthFailures *ratelimit.Failures
	// TrustedProxies are the proxies whose X-Forwarded-For names the client (httpserver.Options).
	TrustedProxies []netip.Prefix
	// ConsoleServices are every service the process serves, in order (nil: the one being served). Each
	// service's console is then the same console for all of them: it names them all, adds all their pages,
	// and labels each operation with its service.
	ConsoleServices []Service
	// Console holds the console's settings from configuration (Secret, SecureCookie, MaxSessionsPerKey);
	// Handler fills in the rest.
	Console console.Options
}

// Handler is the gin engine of svc: the shared router (access log, metrics, recovery, body limit, health,
// GET /metrics without a key when d.Metrics is set), then the service's routes and the operations routes
// (opstatus.Routes, on d.Pool) behind the throttle of failed
// keys when h.AuthFailures is set, authentication, httpserver.CheckURL (so no path or query value a handler
// reads can be one SQL refuses), auth.AgentWrites (an approver key writes only to the approval endpoints and a
// person's decision on an operation, package resolution, served here for every service) and the account's write
// limit when h.WriteLimiter is set; and the browser console at /console (signed in by session cookie; the
// service's ConsolePages among its pages).
func Handler(d Deps, h HTTP, svc Service) *gin.Engine {
	// A span per request, joined to the caller's traceparent, when tracing is on (pkg/tracing).
	middleware := append([]gin.HandlerFunc{httpserver.Tracing}, h.Middleware...)
	if d.Metrics != nil {
		middleware = append([]gin.HandlerFunc{httpserver.Metrics(svc.Name(), d.Metrics.Request)}, middleware...)
	}
	r := httpserver.NewRouter(httpserver.Options{
		Logger: d.Log(), DB: d.Pool, BodyLimit: h.BodyLimit, Ready: h.Ready, Middleware: middleware,
		TrustedProxies: h.TrustedProxies,
	})
	if d.Metrics != nil {
		r.GET("/metrics", gin.WrapH(d.Metrics.Handler()))
	}
	var api []gin.HandlerFunc
	if h.AuthFailures != nil {
		api = append(api, httpserver.Failures(h.AuthFailures))
	}
	api = append(api, httpserver.Wrap(auth.Middleware(h.Keys)), httpserver.CheckURL,
		httpserver.Wrap(auth.AgentWrites(append(approval.WriteRoutes(), resolution.Path)...)))
	if h.WriteLimiter != nil {
		api = append(api, httpserver.Wrap(h.WriteLimiter.Middleware))
	}
	group := r.Group("", api...)
	svc.Routes(group)
	httpserver.Mount(group, opstatus.Routes(d.Pool))
	var decider *resolution.Decider
	if d.Idem != nil {
		decider = &resolution.Decider{Idem: d.Idem, Resolvers: mergeResolvers(d.Resolvers, Resolvers(svc)),
			Services: append(slices.Clip(d.Services), svc.Name())}
		httpserver.Mount(group, decider.Routes())
	}
	if d.Pool != nil && h.Keys != nil {
		covered := h.ConsoleServices
		if len(covered) == 0 {
			covered = []Service{svc}
		}
		names := make([]string, len(covered))
		for i, s := range covered {
			names[i] = s.Name()
		}
		o := h.Console
		o.DB, o.Keys, o.Service, o.Pages, o.Logger = d.Pool, h.Keys, strings.Join(names, " · "), ConsolePagesOf(covered...), d.Log()
		if decider != nil {
			o.Resolve = decider.DecideForm
		}
		routes, err := console.Routes(o)
		if err != nil {
			panic(err) // the templates are embedded: a template that does not parse is a bug no request can cause
		}
		// The security headers go first, so a sign-in the throttle refuses (refused sign-ins count against the
		// client as unknown API keys do) carries them too.
		chain := []gin.HandlerFunc{httpserver.Wrap(console.SecurityHeaders)}
		if h.AuthFailures != nil {
			chain = append(chain, httpserver.Failures(h.AuthFailures))
		}
		httpserver.Mount(r.Group("", chain...), routes)
	}
	return r
}

// ConsolePagesOf gathers the console pages of those of svcs that add some (ConsolePages), each path once.
func ConsolePagesOf(svcs ...Service) []console.Page {
	var pages []console.Page
	seen := map[string]bool{}
	for _, s := range svcs {
		cp, ok := s.(ConsolePages)
		if !ok {
			continue
		}
		for _, p := range cp.ConsolePages() {
			if !seen[p.Path] {
				seen[p.Path] = true
				pages = append(pages, p)
			}
		}
	}
	return pages
}

// Reconcilers merges the reconcilers of svcs. Give the result to the idem.Handler (so a retry of an unknown
// operation settles it at once) and to the recovery worker.
func Reconcilers(svcs ...Service) map[string]opstatus.Reconciler {
	out := map[string]opstatus.Reconciler{}
	for _, s := range svcs {
		for kind, r := range s.Reconcilers() {
			out[kind] = r
		}
	}
	return out
}

// Resolvers merges the resolution.Resolvers of those of svcs that have them (OperationResolvers), for
// Deps.Resolvers.
func Resolvers(svcs ...Service) map[string]resolution.Resolver {
	out := map[string]resolution.Resolver{}
	for _, s := range svcs {
		if rs, ok := s.(OperationResolvers); ok {
			for kind, r := range rs.Resolvers() {
				out[kind] = r
			}
		}
	}
	return out
}

func mergeResolvers(maps ...map[string]resolution.Resolver) map[string]resolution.Resolver {
	out := map[string]resolution.Resolver{}
	for _, m := range maps {
		for kind, r := range m {
			out[kind] = r
		}
	}
	return out
}

// Background configures the process-wide workers that every set of services runs beside its own.
type Background struct {
	// RecoveryInterval is how often expired leases are looked for, and approvals that ran out are recorded
	// expired; PruneInterval how often idempotency keys are pruned (Deps.Idem's Retention and KeyLifetime);
	// SealInterval how often the audit is sealed, signed by Signer when set. A zero interval leaves that worker
	// out (tests that drive recovery by hand).
	RecoveryInterval time.Duration
	PruneInterval    time.Duration
	SealInterval     time.Duration
	Signer           *auditchain.Signer
}

// Workers lists everything that runs in the background for svcs: each service's own workers, the idempotency
// handler's background work (idem.Handler.RunBackground: pruning, recovery with d.Idem.Reconcilers, which the
// wiring sets to Reconcilers(svcs...), sealing) and approval expiry.
func Workers(d Deps, b Background, svcs ...Service) []Worker {
	var out []Worker
	for _, s := range svcs {
		out = append(out, s.Workers()...)
	}
	off := func(d time.Duration) time.Duration {
		if d == 0 {
			return -1
		}
		return d
	}
	if b.RecoveryInterval > 0 || b.PruneInterval > 0 || b.SealInterval > 0 {
		bg := idem.Background{PruneInterval: off(b.PruneInterval), RecoveryInterval: off(b.RecoveryInterval),
			SealInterval: off(b.SealInterval), Signer: b.Signer}
		out = append(out, Worker{Name: "idempotency", Run: func(ctx context.Context) { d.Idem.RunBackground(ctx, bg) }})
	}
	if b.RecoveryInterval > 0 {
		// Approvals are shared by the services, like operations: every process records their expiry, and
		// replicas never record one twice (approval.Expire).
		expiry := &approval.ExpiryWorker{DB: d.Pool, Interval: b.RecoveryInterval, Logger: d.Log()}
		out = append(out, Worker{Name: "approval-expiry", Run: expiry.Run})
	}
	return out
}

// Start runs workers until ctx ends; the returned function waits for all of them to return.
func Start(ctx context.Context, workers []Worker) (wait func()) {
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.Run(ctx) })
	}
	return wg.Wait
}
