// Command retrysafe runs the retrysafe services: tickets, payments and deploys, write APIs that AI agents can
// retry without duplicating effects, and the payment provider sandbox that payments calls.
//
//	retrysafe serve [tickets|payments|deploys|all]   (default all)
//	retrysafe migrate
//	retrysafe provider
//	retrysafe conformance --target URL --request FILE   (the seeds' fault tests against any HTTP API)
//	retrysafe kill-after-claim [--start] --state DIR --health URL -- CMD   (conformance case 7's kill hook)
//	retrysafe audit verify|export|public-key|timeline
//	retrysafe agent do|resume|retry|resolve|verify|show --journal PATH [--tools FILE] ...
//	                                                    (pkg/agent: writes an agent can retry, from a shell)
//	retrysafe mcp --journal PATH [--tools FILE]         (the same tools over MCP, on stdio)
//	retrysafe marker --dir DIR --id ID --operation OP -- CMD   (a host's operation marker, pkg/agent/opmarker)
//	retrysafe env                                       (one shell line pointing a terminal at the demo)
//	retrysafe payments-sweep                            (restore what a failover lost from the provider, once)
//	retrysafe help [COMMAND], retrysafe version
//
// Every command checks its arguments and the whole configuration before it opens anything.
package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/pkg/console"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/metrics"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/ratelimit"
	"github.com/retrysafe/retrysafe/services/schema"
	"github.com/retrysafe/retrysafe/services/tickets"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "retrysafe:", err)
		os.Exit(exitCode(err))
	}
}

// exitCode is 2 for a bad invocation or configuration (nothing was done), the code a command chose for its
// verdict, and 1 for any other failure.
func exitCode(err error) int {
	var ce configError
	var ue usageError
	var ee exitError
	switch {
	case errors.As(err, &ce), errors.As(err, &ue):
		return 2
	case errors.As(err, &ee):
		return ee.code
	default:
		return 1
	}
}

// run is the whole program; tests call it with their own arguments and environment.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cmd, rest, err := parseArgs(args)
	if err != nil {
		return err
	}
	if cmd.name == "help" || wantsHelp(rest) {
		return printHelp(stdout, cmd, rest)
	}
	if cmd.check != nil {
		if err := cmd.check(rest); err != nil {
			return err
		}
	}
	// Traces, when the OTEL_* variables ask for them (pkg/tracing); off otherwise. Spans not yet exported are
	// flushed on the way out.
	shutdown, err := setupTracing(ctx, getenv, "retrysafe-"+cmd.name)
	if err != nil {
		return configError{err.Error()}
	}
	defer func() { _ = shutdown(context.WithoutCancel(ctx)) }()
	if cmd.noConfig {
		return cmd.run(ctx, invocation{args: rest, getenv: getenv, stdout: stdout})
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	logger := newLogger(stdout, cfg.LogLevel)
	slog.SetDefault(logger)
	if err := failpoint.Configure(cfg.Failpoints); err != nil {
		return err
	}
	return cmd.run(ctx, invocation{args: rest, getenv: getenv, stdout: stdout, cfg: cfg, logger: logger})
}

func runMigrate(ctx context.Context, inv invocation) error {
	return migrate(ctx, inv.cfg, inv.logger)
}

func runServe(ctx context.Context, inv invocation) error {
	which := "all"
	if len(inv.args) > 0 {
		which = inv.args[0]
	}
	return serve(ctx, inv.cfg, which, inv.logger)
}

// checkServe refuses an unknown service name before anything is opened or migrated.
func checkServe(args []string) error {
	if len(args) > 1 {
		return usageError{"serve takes one service name; see retrysafe help serve"}
	}
	if len(args) == 0 || args[0] == "all" {
		return nil
	}
	for _, b := range builders {
		if b.name == args[0] {
			return nil
		}
	}
	return usageError{fmt.Sprintf("unknown service %q: want tickets, payments, deploys or all", args[0])}
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}

// openDB opens the pool the services run on, every wait bounded (pkg/database).
func openDB(cfg config) (*gorm.DB, error) {
	db, err := database.Open(cfg.DatabaseURL, database.Options{
		MaxConns: cfg.DBMaxConns, ConnectTimeout: cfg.DBConnectTimeout, AcquireTimeout: cfg.DBAcquireTimeout,
		StatementTimeout: cfg.DBStatementTimeout,
	})
	if err != nil {
		return nil, openDBError(cfg, err)
	}
	return db, nil
}

// openDBError names the database that could not be opened; when DATABASE_URL was unset it also says how to
// reach the one make run uses, which may be a project-local cluster on another port (scripts/devdb.sh).
func openDBError(cfg config, err error) error {
	if cfg.DatabaseDefaulted {
		return fmt.Errorf("open database %s (DATABASE_URL is unset; eval \"$(make -s env)\" in the repository exports the one make run uses): %w", maskURL(cfg.DatabaseURL), err)
	}
	return fmt.Errorf("open database %s: %w", maskURL(cfg.DatabaseURL), err)
}

// migrate applies the migrations on a connection of its own, without the statement timeout of the services'
// pool: building an index on a large table may take longer than any request should. A deploy target in a
// database of its own (DEPLOY_TARGET_DATABASE_URL) gets the same schema there; it uses only its two tables.
func migrate(ctx context.Context, cfg config, logger *slog.Logger) error {
	if err := migrateDatabase(ctx, cfg, cfg.DatabaseURL); err != nil {
		return err
	}
	if cfg.DeployTargetDatabaseURL != "" {
		if err := migrateDatabase(ctx, cfg, cfg.DeployTargetDatabaseURL); err != nil {
			return fmt.Errorf("deploy target: %w", err)
		}
	}
	logger.Info("migrations applied")
	return nil
}

func migrateDatabase(ctx context.Context, cfg config, url string) error {
	db, err := database.Open(url, database.Options{MaxConns: 1, ConnectTimeout: cfg.DBConnectTimeout})
	if err != nil {
		if url != cfg.DatabaseURL {
			return fmt.Errorf("open database %s: %w", maskURL(url), err)
		}
		return openDBError(cfg, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	return schema.Up(ctx, sqlDB)
}

// builders lists the services `serve` knows, in start order, each built through the contract of internal/service.
var builders = []struct {
	name  string
	addr  func(cfg config) string
	build func(cfg config, d service.Deps) (service.Service, error)
}{
	{"tickets", func(c config) string { return c.TicketsAddr }, buildTickets},
	{"payments", func(c config) string { return c.PaymentsAddr }, buildPayments},
	{"deploys", func(c config) string { return c.DeploysAddr }, buildDeploys},
}

func serve(ctx context.Context, cfg config, which string, logger *slog.Logger) error {
	db, err := openDB(cfg)
	if err != nil {
		return err
	}
	pool, err := database.PoolOf(db)
	if err != nil {
		return err
	}
	if cfg.MigrateOnStart {
		if err := migrate(ctx, cfg, logger); err != nil {
			return err
		}
	}
	warnDemoKeys(cfg, logger)
	logger.Info("starting", "config", cfg.String(), "services", which)
	// One registry for the process: every service's port serves all of it on GET /metrics.
	m := metrics.New()
	m.WatchOperations(pool, 2*time.Second)
	m.WatchAudit(pool, 2*time.Second)
	h, err := newIdem(cfg, db, m, logger)
	if err != nil {
		return err
	}
	defer h.Owner.Close()
	d := service.Deps{DB: db, Pool: pool, Logger: logger, Metrics: m, Idem: h}
	httpStack, err := httpStack(cfg, db)
	if err != nil {
		return err
	}
	svcs, addrs, err := buildServices(cfg, d, which)
	if err != nil {
		return err
	}
	// One console: every port serves the same console for all the services this process runs.
	httpStack.ConsoleServices = svcs
	// Before anything runs: a retry of an unknown operation settles it at once.
	d.Idem.Reconcilers = service.Reconcilers(svcs...)
	// A person's decision, sent to any service, releases what the operation held in the service that owns it.
	d.Resolvers = service.Resolvers(svcs...)
	for _, s := range svcs {
		d.Services = append(d.Services, s.Name())
	}
	if err := runServices(ctx, cfg, d, httpStack, svcs, addrs); err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// warnDemoKeys says, in demo mode, that the published demo keys are in use and where the services listen.
func warnDemoKeys(cfg config, logger *slog.Logger) {
	if cfg.DemoKeys && cfg.DemoListenAny {
		logger.Warn("API_KEYS is unset: using the documented demo keys, listening where the addresses say because DEMO_LISTEN_ANY is set; publish the ports on 127.0.0.1 only, and never do this outside development",
			"tickets", cfg.TicketsAddr, "payments", cfg.PaymentsAddr, "deploys", cfg.DeploysAddr)
	} else if cfg.DemoKeys {
		logger.Warn("API_KEYS is unset: using the documented demo keys and listening on 127.0.0.1 only; never do this outside development",
			"tickets", cfg.TicketsAddr, "payments", cfg.PaymentsAddr, "deploys", cfg.DeploysAddr)
	}
}

// newIdem is the process's idempotency handler, configured from cfg, holding the process's owner lock; the
// caller closes h.Owner.
func newIdem(cfg config, db *gorm.DB, m *metrics.Metrics, logger *slog.Logger) (*idem.Handler, error) {
	h, err := idem.New(db)
	if err != nil {
		return nil, err
	}
	h.Logger, h.Lease, h.RetryAfter, h.Observer = logger, cfg.OperationLease, 1, m
	h.Retention, h.KeyLifetime, h.KeyOptional = cfg.IdempotencyRetention, cfg.IdempotencyKeyLifetime, cfg.IdempotencyKeyOptional
	// An effect is sent only with time for a whole provider call left in its lease.
	h.DispatchMargin = cfg.ProviderTimeout
	// The process's owner lock, on a connection of its own: a same-key retry on another replica releases a claim
	// this process made and never started, once the process is gone, instead of waiting for the lease.
	if h.Owner, err = opstatus.HoldOwner(cfg.DatabaseURL, logger); err != nil {
		return nil, err
	}
	return h, nil
}

// buildServices builds the services which names (all, or one), with the address each listens on.
func buildServices(cfg config, d service.Deps, which string) ([]service.Service, []string, error) {
	var svcs []service.Service
	var addrs []string
	for _, b := range builders {
		if which != "all" && which != b.name {
			continue
		}
		s, err := b.build(cfg, d)
		if err != nil {
			return nil, nil, fmt.Errorf("build %s: %w", b.name, err)
		}
		svcs, addrs = append(svcs, s), append(addrs, b.addr(cfg))
	}
	return svcs, addrs, nil
}

// runServices runs the background workers and serves each service on its address until ctx ends or one
// listener fails, which stops them all; the error names every listener that failed.
func runServices(ctx context.Context, cfg config, d service.Deps, httpStack service.HTTP, svcs []service.Service, addrs []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	workers := service.Workers(d, service.Background{
		RecoveryInterval: cfg.RecoveryInterval, PruneInterval: cfg.PruneInterval,
		SealInterval: cfg.AuditSealInterval, Signer: cfg.AuditSigningKey,
	}, svcs...)
	waitWorkers := service.Start(ctx, workers)
	var wg sync.WaitGroup
	errc := make(chan error, len(svcs))
	for i, s := range svcs {
		handler := service.Handler(d, httpStack, s)
		wg.Go(func() {
			if err := httpserver.Serve(ctx, addrs[i], handler, d.Logger.With("service", s.Name()), cfg.HTTP); err != nil {
				errc <- fmt.Errorf("%s: %w", s.Name(), err)
				cancel()
			}
		})
	}
	wg.Wait()
	cancel()
	waitWorkers()
	close(errc)
	var errs []string
	for err := range errc {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// httpStack is the shared HTTP configuration of every service: keys, body limit, one write limiter and one
// throttle of refused keys for the process, the proxies in front, the console's settings, readiness after
// migrations.
func httpStack(cfg config, db *gorm.DB) (service.HTTP, error) {
	sqlDB, err := db.DB()
	if err != nil {
		return service.HTTP{}, err
	}
	var limiter *ratelimit.Limiter
	if cfg.RateLimitWritesPerSecond > 0 {
		limiter = ratelimit.New(ratelimit.Limit{PerSecond: float64(cfg.RateLimitWritesPerSecond), Burst: cfg.RateLimitWriteBurst})
	}
	var failures *ratelimit.Failures
	if cfg.AuthFailuresPerMinute > 0 {
		failures = ratelimit.NewFailures(ratelimit.Limit{PerSecond: float64(cfg.AuthFailuresPerMinute) / 60, Burst: cfg.AuthFailureBurst})
	}
	return service.HTTP{
		Keys: cfg.Keys, BodyLimit: cfg.BodyLimit, WriteLimiter: limiter, AuthFailures: failures,
		TrustedProxies: cfg.HTTP.TrustedProxies,
		Console: console.Options{
			Secret: consoleSecret(cfg), SecureCookie: cfg.ConsoleSecureCookie, MaxSessionsPerKey: cfg.ConsoleMaxSessionsPerKey,
		},
		Ready: func(ctx context.Context) error {
			pending, err := schema.Pending(ctx, sqlDB)
			if err != nil {
				return fmt.Errorf("migrations unknown")
			}
			if pending {
				return fmt.Errorf("migrations pending")
			}
			return nil
		},
	}, nil
}

// consoleSecret signs the console's sign-in forms. It is derived from API_KEY_ID_SECRET, so every replica
// accepts the forms of the others, and keyed apart from the key ids it also makes. In demo mode (no
// API_KEY_ID_SECRET) it is nil: each console draws its own.
func consoleSecret(cfg config) []byte {
	if cfg.APIKeyIDSecret == "" {
		return nil
	}
	mac := hmac.New(sha256.New, []byte(cfg.APIKeyIDSecret))
	mac.Write([]byte("retrysafe console sign-in forms"))
	return mac.Sum(nil)
}

func buildTickets(cfg config, d service.Deps) (service.Service, error) {
	policy := tickets.ApprovalPolicy{Projects: cfg.TicketsApprovalProjects}
	for _, p := range cfg.TicketsApprovalPriorities {
		policy.Priorities = append(policy.Priorities, tickets.Priority(p))
	}
	return tickets.New(d, tickets.Config{Approval: policy, ApprovalTTL: cfg.ApprovalTTL})
}
