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

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == bench.TargetBaseline {
		return bench.ServeBaseline(ctx, getenv("DATABASE_URL"), getenv("ADDR"))
	}
	if len(args) > 0 && args[0] == bench.TargetCeiling {
		return bench.ServeCeiling(ctx, getenv("DATABASE_URL"), getenv("ADDR"))
	}
	if len(args) > 0 && args[0] == bench.TargetSchemaCeiling {
		return bench.ServeSchemaCeiling(ctx, getenv("DATABASE_URL"), getenv("ADDR"))
	}
	fs := flag.NewFlagSet("retrysafe-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pg := fs.String("pg", "postgres://postgres@127.0.0.1:5432", "PostgreSQL server (no database): the harness makes and drops its databases there")
	bin := fs.String("bin", "bin/retrysafe", "the retrysafe binary to measure")
	d := fs.Duration("d", 10*time.Second, "duration of each timed mode")
	warmup := fs.Duration("warmup", 3*time.Second, "untimed create before the timed modes of each target")
	clients := fs.Int("c", 32, "concurrent clients")
	storm := fs.Int("storm", 1000, "copies of one key sent at once")
	keys := fs.Int("keys", 1000, "stored keys that replay cycles over")
	pgbench := fs.Bool("pgbench", true, "measure pgbench's one-row insert first, when pgbench is installed")
	ceiling := fs.Bool("ceiling", true, "measure the ceiling too: the baseline with the least idempotency, a stored key (internal/bench/ceiling.go)")
	schemaCeiling := fs.Bool("schema-ceiling", true, "measure the schema ceiling too: the ceiling writing retrysafe's rows into retrysafe's schema (internal/bench/schemaceiling.go)")
	payments := fs.Bool("payments", true, "measure payments' intent create and capture")
	preload := fs.Int64("preload", 0, "growth: also measure create and replay on tables holding this many completed creates")
	preloadSQL := fs.String("preload-sql", "scripts/bench-preload.sql", "the loader of -preload")
	preloadFor := fs.Duration("preload-for", 0, "stop loading after this long and measure with what was loaded (0: load all of -preload)")
	batch := fs.Int64("preload-batch", 250_000, "creates loaded per transaction")
	chart := fs.String("chart", "docs/bench.png", "PNG chart to write (empty: none)")
	logs := fs.String("logs", "", "directory for the servers' logs (default: a new temporary directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *d < time.Second || *clients < 1 || *storm < 1 || *keys < 1 || *preload < 0 {
		return errors.New("-d must be at least 1s, -c, -storm and -keys at least 1, -preload not negative")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	binPath, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(binPath); err != nil {
		return fmt.Errorf("-bin: %w (make bench builds it)", err)
	}
	logDir := *logs
	if logDir == "" {
		if logDir, err = os.MkdirTemp("", "retrysafe-bench-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	secret := getenv("API_KEY_ID_SECRET")
	if secret == "" {
		secret = bench.DefaultKeyIDSecret
	}
	tty := false
	if f, ok := stderr.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	cfg := bench.Config{
		Server: bench.Server{Base: *pg}, Bin: binPath, Self: self,
		Duration: *d, Warmup: *warmup, Clients: *clients, Storm: *storm, ReplayKeys: *keys,
		Pgbench: *pgbench, Ceiling: *ceiling, SchemaCeiling: *schemaCeiling, Payments: *payments,
		Preload: *preload, PreloadSQL: *preloadSQL, PreloadBatch: *batch, PreloadFor: *preloadFor,
		KeyIDSecret: secret, Chart: *chart, LogDir: logDir, Out: stdout, Progress: stderr, TTY: tty,
	}
	fmt.Fprintf(stderr, "bench: servers' logs in %s\n", logDir)
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := bench.Print(stdout, rep); err != nil {
		return err
	}
	if *chart != "" {
		series := []bench.Series{{Name: "baseline (gin + gorm insert)", Target: bench.TargetBaseline}}
		if *ceiling {
			series = append(series, bench.Series{Name: "ceiling (the insert and a stored key)", Target: bench.TargetCeiling})
		}
		if *schemaCeiling {
			series = append(series, bench.Series{Name: "schema ceiling (retrysafe's rows, nothing else)", Target: bench.TargetSchemaCeiling})
		}
		series = append(series, bench.Series{Name: "retrysafe serve tickets", Target: bench.TargetTickets})
		if rep.Preloaded > 0 {
			t := fmt.Sprintf("retrysafe, %s preloaded", bench.Count(rep.Preloaded))
			series = append(series, bench.Series{Name: t, Target: t})
		}
		title := fmt.Sprintf("POST /v1/tickets, %d clients, %s per mode, storm of %d; %s, load average %s at the start, %s at the end",
			*clients, *d, *storm, rep.Started.UTC().Format("2006-01-02"), first(rep.LoadStart), first(rep.Load))
		if err := bench.Chart(*chart, title, rep.Results, []string{"create", "replay", "storm"}, series); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		fmt.Fprintf(stderr, "bench: chart in %s\n", *chart)
	}
	return nil
}

// first is the 1-minute figure of a load average line.
func first(load string) string {
	f := strings.Fields(load)
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
