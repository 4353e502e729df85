package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
)

// version is set at build time (-ldflags "-X main.version=v1.2.3"); otherwise the VCS revision Go recorded.
var version = ""

// usageError is a bad invocation: exit code 2, nothing done.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg + " (retrysafe help lists the commands)" }

// exitError carries a command's own exit code (audit verify: 1 for a broken chain), with its message.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// invocation is what a command runs with; cfg and logger are set unless the command has noConfig.
type invocation struct {
	args   []string
	getenv func(string) string
	stdout io.Writer
	cfg    config
	logger *slog.Logger
}

// command is one subcommand: its help text lists the environment variables it reads.
type command struct {
	name     string
	synopsis string
	summary  string
	env      string
	// check refuses bad arguments before the configuration is read or anything is opened.
	check    func(args []string) error
	noConfig bool
	run      func(ctx context.Context, inv invocation) error
}

const commonEnv = `  LOG_LEVEL                 debug, info (default), warn or error; JSON logs on stdout
  OTEL_TRACES_EXPORTER      otlp (OTLP/HTTP, OTEL_EXPORTER_OTLP_*) or console: traces (default off; pkg/tracing)
  RETRYSAFE_FAILPOINTS      crash points for tests, name=pause|exit,...`

const databaseEnv = `  DATABASE_URL              postgres:// URL (default postgres://postgres@127.0.0.1:5432/retrysafe?sslmode=disable)
  DB_MAX_CONNS              connection pool size (default 20)
  DB_CONNECT_TIMEOUT        bound on opening a connection (default 3s)
  DB_ACQUIRE_TIMEOUT        bound on waiting for a free pooled connection (default 3s)
  DB_STATEMENT_TIMEOUT      bound on each statement, client and server side (default 5s; not for migrations)`

// serveEnv is what serve reads.
const serveEnv = databaseEnv + `
  MIGRATE_ON_START          apply migrations at start (default true)
  API_KEYS                  account_id:role:secret,... role agent or approver, secrets of 24 characters or more
                            (unset: the demo keys, development only, listening on 127.0.0.1 only)
  DEMO_LISTEN_ANY           true: demo mode listens where the addresses say (a container publishing on 127.0.0.1)
  API_KEY_ID_SECRET         random, 32 characters or more, required with API_KEYS: keys the hash that makes key ids
  RETRYSAFE_PORT_BASE       the port every default address below is derived from (default 8080): tickets +1,
                            payments +2, deploys +3, the provider +10; one setting moves the whole demo
  TICKETS_ADDR PAYMENTS_ADDR DEPLOYS_ADDR   listen addresses (default :8081 :8082 :8083; 127.0.0.1 in demo mode)
  BODY_LIMIT_BYTES          largest request body (default 1048576)
  RATE_LIMIT_WRITES_PER_SECOND RATE_LIMIT_WRITE_BURST   each account's writes: a token bucket (default 50/s,
                            bursts of 200; 0 per second turns it off); over it: 429 rate_limited with Retry-After
  AUTH_FAILURES_PER_MINUTE AUTH_FAILURE_BURST   unknown keys and refused console sign-ins per client address
                            (default 30/min, bursts of 20; 0 per minute turns it off); over it: 429 on every request
  HTTP_MAX_CONNS            connections open at once, per listening port (default 1024; a new one closes the
                            connection idle longest, or waits to be accepted while none is idle)
  HTTP_MAX_CONNS_PER_CLIENT connections of one client address, an IPv6 /64 (default 64, 0 for no cap); loopback
                            and HTTP_TRUSTED_PROXIES are not capped
  HTTP_IDLE_TIMEOUT         keep-alive connections idle longer are closed (default 30s)
  HTTP_TRUSTED_PROXIES      IPs or CIDRs of the proxies in front, whose X-Forwarded-For names the client (default none)
  CONSOLE_SECURE_COOKIE     true: the console's cookies are Secure on plain HTTP too, behind a TLS proxy (default false)
  CONSOLE_MAX_SESSIONS_PER_KEY   console sessions one key holds; a new sign-in ends the least recent (default 10)
  IDEMPOTENCY_RETENTION     how long a finished key's response is replayed (default 72h, at least 24h)
  IDEMPOTENCY_KEY_LIFETIME  how long the key itself is kept after, never run twice (default 2160h, at least the retention)
  IDEMPOTENCY_KEY_OPTIONAL  true: a write without Idempotency-Key runs unprotected, answered with
                            Idempotency-Key-Absent: true; a migration path for clients without keys (default false)
  PRUNE_INTERVAL            how often finished keys are pruned (default 10m)
  OPERATION_LEASE           how long an external effect may run before it is called unknown (default 30s)
  RECOVERY_INTERVAL         how often expired leases are looked for (default 5s)
  PROVIDER_URL              the payment provider (default http://127.0.0.1:8090, RETRYSAFE_PORT_BASE + 10)
  PROVIDER_SECRET           our merchant secret at the provider (masked in logs)
  PROVIDER_TIMEOUT          bound of one provider call, below OPERATION_LEASE (default 5s)
  PAYMENTS_APPROVAL_THRESHOLDS   CURRENCY:minor_units,... above which captures and refunds need approval
  APPROVAL_TTL              how long an approval can be used (default 1h)
  PAYMENTS_SWEEP_INTERVAL   how often payments compares the provider's effects with its rows and restores what a
                            failover lost (default 1m); retrysafe payments-sweep runs it once
  PAYMENTS_SWEEP_CHECK      how often the database's timeline is read, to sweep at once after a failover (default 5s)
  TICKETS_APPROVAL_PRIORITIES TICKETS_APPROVAL_PROJECTS   new tickets of these priorities or in these projects
                            need approval (comma-separated; default none)
  DEPLOY_STEPS DEPLOY_STEP_DURATION   simulated deploy steps (default 3 of 2s)
  DEPLOY_APPROVAL_ENVIRONMENTS        environments whose deploys need approval (default production)
  DEPLOY_LOCK_LEASE DEPLOY_HEARTBEAT_INTERVAL   release lock lease (30s) and heartbeat (5s, at most half of it)
  DEPLOY_POLL_INTERVAL DEPLOY_WORKERS           controller polling (1s) and concurrency (2)
  DEPLOY_MAX_RUNNING_PER_ACCOUNT   deploys of one account running at once, across replicas (default 1)
  DEPLOY_QUEUE_TIMEOUT      a deploy queued longer fails with reason queue_timeout, freeing its lock (default 10m)
  DEPLOY_TARGET_DATABASE_URL   the simulated deploy target's own database (default: DATABASE_URL's); migrate
                            and MIGRATE_ON_START migrate it too
  AUDIT_SEAL_INTERVAL       how often new audit records are sealed (default 1s): they are tamper-evident from then
  AUDIT_SIGNING_KEY         Ed25519 seed (32 bytes, base64) that signs seals (unset: unsigned; masked)
` + commonEnv

// providerEnv is what provider reads.
const providerEnv = `  PROVIDER_ADDR             listen address (default :8090, RETRYSAFE_PORT_BASE + 10; 127.0.0.1 only while
                            API_KEYS is unset)
  PROVIDER_FAULT_INJECTION  enable /admin/faults and /admin/reset (default false)
  HTTP_MAX_CONNS HTTP_MAX_CONNS_PER_CLIENT HTTP_IDLE_TIMEOUT HTTP_TRUSTED_PROXIES   as for serve
` + commonEnv

var commands []command

func init() {
	commands = []command{
		{
			name: "serve", synopsis: "serve [tickets|payments|deploys|all]",
			summary: "serve the write APIs (default all), migrating the database first",
			check:   checkServe, run: runServe, env: serveEnv,
		},
		{
			name: "migrate", synopsis: "migrate", summary: "apply the database migrations and exit",
			check: noArgs("migrate"), run: runMigrate, env: databaseEnv + "\n" + commonEnv,
		},
		{
			name: "provider", synopsis: "provider", summary: "serve the payment provider sandbox that payments calls",
			check: noArgs("provider"), run: func(ctx context.Context, inv invocation) error { return serveProvider(ctx, inv.cfg, inv.logger) },
			env: providerEnv,
		},
		conformanceCommand, killHookCommand(),
		{
			name: "version", synopsis: "version", summary: "print the version", noConfig: true,
			check: noArgs("version"),
			run: func(_ context.Context, inv invocation) error {
				_, err := fmt.Fprintln(inv.stdout, "retrysafe", versionString())
				return err
			},
		},
		auditCommand(),
		agentCommand(), mcpCommand(), envCommand(),
		markerCommand(), sweepCommand(),
		{name: "help", synopsis: "help [COMMAND]", summary: "describe the commands, or one command and the variables it reads", noConfig: true},
	}
}

func noArgs(name string) func(args []string) error {
	return func(args []string) error {
		if len(args) > 0 {
			return usageError{fmt.Sprintf("%s takes no arguments, got %q", name, strings.Join(args, " "))}
		}
		return nil
	}
}

func findCommand(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// parseArgs finds the command; --help, -h and --version work in place of one.
func parseArgs(args []string) (command, []string, error) {
	if len(args) == 0 {
		return command{}, nil, usageError{"no command given"}
	}
	name := args[0]
	switch name {
	case "--help", "-h", "-help":
		name = "help"
	case "--version", "-version":
		name = "version"
	}
	cmd, ok := findCommand(name)
	if !ok {
		return command{}, nil, usageError{fmt.Sprintf("unknown command %q", args[0])}
	}
	return cmd, args[1:], nil
}

func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--help" || a == "-h" || a == "-help" {
			return true
		}
	}
	return false
}

// printHelp prints the command list, or one command's help when cmd is not help itself or help names one.
func printHelp(w io.Writer, cmd command, args []string) error {
	if cmd.name == "help" && len(args) > 0 && !wantsHelp(args[:1]) {
		c, ok := findCommand(args[0])
		if !ok {
			return usageError{fmt.Sprintf("no help for unknown command %q", args[0])}
		}
		cmd = c
	}
	if cmd.name != "help" {
		fmt.Fprintf(w, "usage: retrysafe %s\n\n%s.\n", cmd.synopsis, cmd.summary)
		if cmd.env != "" {
			fmt.Fprintf(w, "\nEnvironment:\n%s\n", cmd.env)
		}
		return nil
	}
	fmt.Fprintf(w, "retrysafe %s: write APIs that AI agents can retry without duplicating effects.\n\nCommands:\n", versionString())
	for _, c := range commands {
		fmt.Fprintf(w, "  %-40s %s\n", c.synopsis, c.summary)
	}
	fmt.Fprintln(w, "\nretrysafe COMMAND --help lists the environment variables a command reads.")
	fmt.Fprintln(w, "Exit codes: 0 done, 1 failed, 2 bad invocation or configuration (nothing was done).")
	return nil
}

func versionString() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	v := info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			v += "+dirty"
		}
	}
	return v
}
