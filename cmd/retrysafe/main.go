// Command retrysafe runs the retrysafe services: tickets, payments and deploys, write APIs that AI agents can
// retry without duplicating effects, and the payment provider sandbox that payments calls.
//
//	retrysafe serve [tickets|payments|deploys|all]   (default all)
//	retrysafe migrate
//	retrysafe provider
//	retrysafe help [COMMAND], retrysafe version
//
// Every command checks its arguments and the whole configuration before it opens anything.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/retrysafe/retrysafe/migrations"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
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
	db, err := openDB(inv.cfg)
	if err != nil {
		return err
	}
	return migrate(ctx, db, inv.logger)
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

func openDB(cfg config) (*gorm.DB, error) {
	db, err := gorm.Open(postgres.Open(cfg.DatabaseURL), &gorm.Config{
		Logger:                 gormlogger.Discard,
		SkipDefaultTransaction: true,
	})
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", maskURL(cfg.DatabaseURL), err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(cfg.DBMaxConns)
	sqlDB.SetMaxIdleConns(cfg.DBMaxConns)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	return db, nil
}

func migrate(ctx context.Context, db *gorm.DB, logger *slog.Logger) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	if err := migrations.Up(ctx, sqlDB); err != nil {
		return err
	}
	logger.Info("migrations applied")
	return nil
}

// deps is what every service is built from.
type deps struct {
	cfg    config
	db     *gorm.DB
	keys   *auth.Keys
	logger *slog.Logger
	idem   *idem.Handler
}

// service is one HTTP service of the process and the background work it brings.
type service struct {
	name        string
	addr        string
	handler     http.Handler
	reconcilers map[string]opstatus.Reconciler
	workers     []func(ctx context.Context)
}

// builders lists the services `serve` knows, in start order.
var builders = []struct {
	name  string
	build func(d deps) (service, error)
}{
	{"tickets", buildTickets},
	{"payments", buildPayments},
	{"deploys", buildDeploys},
}

func serve(ctx context.Context, cfg config, which string, logger *slog.Logger) error {
	db, err := openDB(cfg)
	if err != nil {
		return err
	}
	if cfg.MigrateOnStart {
		if err := migrate(ctx, db, logger); err != nil {
			return err
		}
	}
	if cfg.DemoKeys {
		logger.Warn("API_KEYS is unset: using the documented demo keys; never do this outside development")
	}
	logger.Info("starting", "config", cfg.String(), "services", which)
	d := deps{cfg: cfg, db: db, keys: cfg.Keys, logger: logger, idem: &idem.Handler{
		DB: db, Store: idem.PostgresStore{}, Logger: logger, Lease: cfg.OperationLease, RetryAfter: 1,
	}}

	var services []service
	for _, b := range builders {
		if which != "all" && which != b.name {
			continue
		}
		s, err := b.build(d)
		if err != nil {
			return fmt.Errorf("build %s: %w", b.name, err)
		}
		services = append(services, s)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	reconcilers := map[string]opstatus.Reconciler{}
	for _, s := range services {
		for kind, r := range s.reconcilers {
			reconcilers[kind] = r
		}
	}
	d.idem.Reconcilers = reconcilers // before anything runs: a retry of an unknown operation settles it at once
	for _, s := range services {
		for _, w := range s.workers {
			wg.Go(func() { w(ctx) })
		}
	}
	recovery := &opstatus.RecoveryWorker{DB: db, Reconcilers: reconcilers, Interval: cfg.RecoveryInterval, Logger: logger}
	pruner := &idem.Pruner{DB: db, Store: d.idem.Store, Retention: cfg.IdempotencyRetention, Interval: cfg.PruneInterval, Logger: logger}
	wg.Go(func() { recovery.Run(ctx) })
	wg.Go(func() { pruner.Run(ctx) })

	errc := make(chan error, len(services))
	for _, s := range services {
		wg.Go(func() {
			if err := httpserver.Serve(ctx, s.addr, s.handler, logger.With("service", s.name)); err != nil {
				errc <- fmt.Errorf("%s: %w", s.name, err)
				cancel()
			}
		})
	}
	wg.Wait()
	close(errc)
	var errs []string
	for err := range errc {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	logger.Info("stopped")
	return nil
}

// router is the shared HTTP stack of a service; routes go on the returned authenticated group.
func router(d deps) (*httpserverRouter, error) {
	sqlDB, err := d.db.DB()
	if err != nil {
		return nil, err
	}
	r := httpserver.NewRouter(httpserver.Options{
		Logger: d.logger, DB: d.db, BodyLimit: d.cfg.BodyLimit,
		Ready: func(ctx context.Context) error {
			pending, err := migrations.Pending(ctx, sqlDB)
			if err != nil {
				return fmt.Errorf("migrations unknown")
			}
			if pending {
				return fmt.Errorf("migrations pending")
			}
			return nil
		},
	})
	return &httpserverRouter{Engine: r, API: r.Group("", auth.Middleware(d.keys))}, nil
}

func buildTickets(d deps) (service, error) {
	r, err := router(d)
	if err != nil {
		return service{}, err
	}
	tickets.Routes(r.API, &tickets.Server{DB: d.db, Store: tickets.PostgresStore{}, Idem: d.idem})
	return service{name: "tickets", addr: d.cfg.TicketsAddr, handler: r.Engine}, nil
}
