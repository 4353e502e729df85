// Command retrysafe-bench is the load benchmark behind `make bench` (internal/bench): a bare gin + gorm ticket
// insert (the baseline) beside `retrysafe serve tickets`, payments' intent create and capture against the provider
// sandbox, and, with -preload N, the tickets service on tables that already hold N completed creates. Each runs
// as its own process on its own fresh database; the load comes from this process over loopback.
//
//	retrysafe-bench -pg postgres://postgres@127.0.0.1:5432 -bin bin/retrysafe [-d 10s] [-c 32] [-preload N]
//	retrysafe-bench baseline    (the baseline server: DATABASE_URL, ADDR; started by the harness itself)
//	retrysafe-bench ceiling     (the ceiling server, likewise)
//	retrysafe-bench schema-ceiling  (the schema ceiling server, likewise)
//
// It prints a table on stdout, progress on stderr, and draws -chart (a PNG).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/retrysafe/retrysafe/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "retrysafe-bench:", err)
		os.Exit(1)
	}
}

// servers are the servers the harness starts as this binary's own processes, by their first argument. Each
// reads DATABASE_URL and ADDR.
var servers = map[string]func(ctx context.Context, databaseURL, addr string) error{
	bench.TargetBaseline:      bench.ServeBaseline,
	bench.TargetCeiling:       bench.ServeCeiling,
	bench.TargetSchemaCeiling: bench.ServeSchemaCeiling,
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		if serve := servers[args[0]]; serve != nil {
			return serve(ctx, getenv("DATABASE_URL"), getenv("ADDR"))
		}
	}
	cfg, err := configure(args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "bench: servers' logs in %s\n", cfg.LogDir)
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := bench.Print(stdout, rep); err != nil {
		return err
	}
	if cfg.Chart == "" {
		return nil
	}
	if err := drawChart(cfg, rep); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	fmt.Fprintf(stderr, "bench: chart in %s\n", cfg.Chart)
	return nil
}

// configure reads the harness's configuration from its flags and environment, with the binaries and the log
// directory found (and the log directory made).
func configure(args []string, getenv func(string) string, stdout, stderr io.Writer) (bench.Config, error) {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return bench.Config{}, err
	}
	if cfg.Self, err = os.Executable(); err != nil {
		return bench.Config{}, err
	}
	if cfg.Bin, err = filepath.Abs(cfg.Bin); err != nil {
		return bench.Config{}, err
	}
	if _, err := os.Stat(cfg.Bin); err != nil {
		return bench.Config{}, fmt.Errorf("-bin: %w (make bench builds it)", err)
	}
	if cfg.LogDir, err = logDirectory(cfg.LogDir); err != nil {
		return bench.Config{}, err
	}
	cfg.KeyIDSecret = getenv("API_KEY_ID_SECRET")
	if cfg.KeyIDSecret == "" {
		cfg.KeyIDSecret = bench.DefaultKeyIDSecret
	}
	cfg.Out, cfg.Progress, cfg.TTY = stdout, stderr, isTerminal(stderr)
	return cfg, nil
}

// parseFlags reads the flags into a Config, with usage and errors written to stderr.
func parseFlags(args []string, stderr io.Writer) (bench.Config, error) {
	var cfg bench.Config
	fs := flag.NewFlagSet("retrysafe-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Server.Base, "pg", "postgres://postgres@127.0.0.1:5432", "PostgreSQL server (no database): the harness makes and drops its databases there")
	fs.StringVar(&cfg.Bin, "bin", "bin/retrysafe", "the retrysafe binary to measure")
	fs.DurationVar(&cfg.Duration, "d", 10*time.Second, "duration of each timed mode")
	fs.DurationVar(&cfg.Warmup, "warmup", 3*time.Second, "untimed create before the timed modes of each target")
	fs.IntVar(&cfg.Clients, "c", 32, "concurrent clients")
	fs.IntVar(&cfg.Storm, "storm", 1000, "copies of one key sent at once")
	fs.IntVar(&cfg.ReplayKeys, "keys", 1000, "stored keys that replay cycles over")
	fs.BoolVar(&cfg.Pgbench, "pgbench", true, "measure pgbench's one-row insert first, when pgbench is installed")
	fs.BoolVar(&cfg.Ceiling, "ceiling", true, "measure the ceiling too: the baseline with the least idempotency, a stored key (internal/bench/ceiling.go)")
	fs.BoolVar(&cfg.SchemaCeiling, "schema-ceiling", true, "measure the schema ceiling too: the ceiling writing retrysafe's rows into retrysafe's schema (internal/bench/schemaceiling.go)")
	fs.BoolVar(&cfg.Payments, "payments", true, "measure payments' intent create and capture")
	fs.Int64Var(&cfg.Preload, "preload", 0, "growth: also measure create and replay on tables holding this many completed creates")
	fs.DurationVar(&cfg.PreloadFor, "preload-for", 0, "stop loading after this long and measure with what was loaded (0: load all of -preload)")
	fs.Int64Var(&cfg.PreloadBatch, "preload-batch", 250_000, "creates loaded per transaction")
	fs.StringVar(&cfg.Chart, "chart", "docs/bench.png", "PNG chart to write (empty: none)")
	fs.StringVar(&cfg.LogDir, "logs", "", "directory for the servers' logs (default: a new temporary directory)")
	if err := fs.Parse(args); err != nil {
		return bench.Config{}, err
	}
	if fs.NArg() > 0 {
		return bench.Config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.Duration < time.Second || cfg.Clients < 1 || cfg.Storm < 1 || cfg.ReplayKeys < 1 || cfg.Preload < 0 {
		return bench.Config{}, errors.New("-d must be at least 1s, -c, -storm and -keys at least 1, -preload not negative")
	}
	return cfg, nil
}

// logDirectory makes dir, or a new temporary directory when dir is empty, and returns it.
func logDirectory(dir string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", "retrysafe-bench-")
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// isTerminal reports whether w is a terminal, where progress rewrites one line.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// drawChart draws the create, replay and storm results of each measured ticket target to cfg.Chart.
func drawChart(cfg bench.Config, rep *bench.Report) error {
	series := []bench.Series{{Name: "baseline (gin + gorm insert)", Target: bench.TargetBaseline}}
	if cfg.Ceiling {
		series = append(series, bench.Series{Name: "ceiling (the insert and a stored key)", Target: bench.TargetCeiling})
	}
	if cfg.SchemaCeiling {
		series = append(series, bench.Series{Name: "schema ceiling (retrysafe's rows, nothing else)", Target: bench.TargetSchemaCeiling})
	}
	series = append(series, bench.Series{Name: "retrysafe serve tickets", Target: bench.TargetTickets})
	if rep.Preloaded > 0 {
		t := fmt.Sprintf("retrysafe, %s preloaded", bench.Count(rep.Preloaded))
		series = append(series, bench.Series{Name: t, Target: t})
	}
	title := fmt.Sprintf("POST /v1/tickets, %d clients, %s per mode, storm of %d; %s, load average %s at the start, %s at the end",
		cfg.Clients, cfg.Duration, cfg.Storm, rep.Started.UTC().Format("2006-01-02"), first(rep.LoadStart), first(rep.Load))
	return bench.Chart(cfg.Chart, title, rep.Results, []string{"create", "replay", "storm"}, series)
}

// first is the 1-minute figure of a load average line.
func first(load string) string {
	f := strings.Fields(load)
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
