package main

import (
	"bytes"
	"context"
	"database/sql"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/poll"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/migrations"
)

// A key id secret and an API key secret of the lengths config asks for, for tests that set API_KEYS.
const (
	testIDSecret = "test-key-id-secret-0123456789abcdef"
	testSecret   = "test-secret-0123456789abcdef"
)

func env(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

// TestRunServesAndShutsDown runs the real program (run) on a test schema, talks to it, and stops it the way a
// SIGTERM does: by cancelling its context. run must return nil after a graceful shutdown.
func TestRunServesAndShutsDown(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	addr := proctest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "tickets"}, env(map[string]string{
			"DATABASE_URL": db.DSN, "TICKETS_ADDR": addr, "API_KEYS": "acct_e2e:agent:e2e-secret-0123456789abcdef",
			"API_KEY_ID_SECRET": testIDSecret, "LOG_LEVEL": "info",
		}), &syncWriter{w: &out})
	}()
	base := "http://" + addr
	waitHealthy(t, base+"/readyz", done)

	c := apitest.New(t, base, "e2e-secret-0123456789abcdef")
	first := c.Post("/v1/tickets", `{"project":"ops","title":"from run"}`, apitest.Key("e2e")).Status(t, http.StatusCreated)
	again := c.Post("/v1/tickets", `{"title":"from run","project":"ops"}`, apitest.Key("e2e")).Status(t, http.StatusCreated)
	if again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
		t.Error("no replay through the real program")
	}
	c.As(servicetest.AgentSecret).Get("/v1/tickets").Status(t, http.StatusUnauthorized) // demo keys are off when API_KEYS is set

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v after shutdown", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not stop within 15s of its context ending")
	}
	logs := out.String()
	if strings.Contains(logs, "e2e-secret") || strings.Contains(logs, testIDSecret) {
		t.Error("a secret reached the log")
	}
	if !strings.Contains(logs, `"operation_id":"op_`) || !strings.Contains(logs, `"replayed":true`) {
		t.Errorf("the access log lacks operation ids or replays:\n%s", logs)
	}
	if strings.Contains(logs, "from run") {
		t.Error("a request body reached the log")
	}
}

func waitHealthy(t *testing.T, url string, done chan error) {
	t.Helper()
	poll.Until(t, url+" ready", func() bool {
		select {
		case err := <-done:
			t.Fatalf("run stopped early: %v", err)
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// TestRunRejectsBadInvocations: a bad command, argument or variable is one error naming it, exit code 2, and
// nothing is opened: DATABASE_URL points at a port where nothing listens, so any I/O would fail differently.
func TestRunRejectsBadInvocations(t *testing.T) {
	t.Parallel()
	nowhere := "postgres://postgres@127.0.0.1:1/none?sslmode=disable"
	for _, tc := range []struct {
		args []string
		vars map[string]string
		want string
	}{
		{nil, nil, "no command"},
		{[]string{"launch"}, nil, "unknown command"},
		{[]string{"serve", "nope"}, nil, "unknown service"},
		{[]string{"serve", "tickets", "extra"}, nil, "one service name"},
		{[]string{"migrate", "now"}, nil, "no arguments"},
		{[]string{"provider", "x"}, nil, "no arguments"},
		{[]string{"help", "launch"}, nil, "unknown command"},
		{[]string{"serve", "tickets"}, map[string]string{"IDEMPOTENCY_RETENTION": "1h"}, "IDEMPOTENCY_RETENTION"},
		{[]string{"serve", "tickets"}, map[string]string{"OPERATION_LEASE": "soon"}, "OPERATION_LEASE"},
		{[]string{"serve", "tickets"}, map[string]string{"OPERATION_LEASE": "-5s"}, "OPERATION_LEASE"},
		{[]string{"serve", "tickets"}, map[string]string{"API_KEYS": "acct:admin:s", "API_KEY_ID_SECRET": testIDSecret}, "API_KEYS"},
		{[]string{"serve", "tickets"}, map[string]string{"API_KEYS": "acct:agent:secret-of-23-characters", "API_KEY_ID_SECRET": testIDSecret}, "API_KEYS"},
		{[]string{"serve", "tickets"}, map[string]string{"API_KEYS": "acct:agent:" + testSecret}, "API_KEY_ID_SECRET"},
		{[]string{"serve", "tickets"}, map[string]string{"API_KEYS": "acct:agent:" + testSecret, "API_KEY_ID_SECRET": "short"}, "API_KEY_ID_SECRET"},
		{[]string{"serve", "tickets"}, map[string]string{"TICKETS_ADDR": "192.0.2.1:8081"}, "TICKETS_ADDR"},
		{[]string{"provider"}, map[string]string{"PROVIDER_ADDR": "example.com:8090"}, "PROVIDER_ADDR"},
		{[]string{"serve", "tickets"}, map[string]string{"RETRYSAFE_FAILPOINTS": "x=explode"}, "RETRYSAFE_FAILPOINTS"},
		{[]string{"serve", "tickets"}, map[string]string{"DB_MAX_CONNS": "0"}, "DB_MAX_CONNS"},
		{[]string{"serve", "tickets"}, map[string]string{"TICKETS_ADDR": "8081"}, "TICKETS_ADDR"},
		{[]string{"serve", "tickets"}, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{[]string{"serve", "tickets"}, map[string]string{"MIGRATE_ON_START": "yes please"}, "MIGRATE_ON_START"},
		{[]string{"serve", "tickets"}, map[string]string{"PROVIDER_URL": "ftp://x"}, "PROVIDER_URL"},
		{[]string{"serve", "tickets"}, map[string]string{"DEPLOY_HEARTBEAT_INTERVAL": "20s"}, "DEPLOY_HEARTBEAT_INTERVAL"},
		{[]string{"serve", "deploys"}, map[string]string{"DEPLOY_MAX_RUNNING_PER_ACCOUNT": "0"}, "DEPLOY_MAX_RUNNING_PER_ACCOUNT"},
		{[]string{"serve", "deploys"}, map[string]string{"DEPLOY_MAX_RUNNING_PER_ACCOUNT": "two"}, "DEPLOY_MAX_RUNNING_PER_ACCOUNT"},
		{[]string{"serve", "deploys"}, map[string]string{"DEPLOY_QUEUE_TIMEOUT": "0s"}, "DEPLOY_QUEUE_TIMEOUT"},
		{[]string{"serve", "deploys"}, map[string]string{"DEPLOY_QUEUE_TIMEOUT": "forever"}, "DEPLOY_QUEUE_TIMEOUT"},
		{[]string{"serve", "deploys"}, map[string]string{"DEPLOY_TARGET_DATABASE_URL": "mysql://root@x/db"}, "DEPLOY_TARGET_DATABASE_URL"},
		{[]string{"migrate"}, map[string]string{"DATABASE_URL": "mysql://root@x/db"}, "DATABASE_URL"},
	} {
		vars := map[string]string{"DATABASE_URL": nowhere}
		for k, v := range tc.vars {
			vars[k] = v
		}
		var out bytes.Buffer
		err := run(context.Background(), tc.args, env(vars), &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%v, %v) = %v, want an error mentioning %q", tc.args, tc.vars, err, tc.want)
			continue
		}
		if code := exitCode(err); code != 2 {
			t.Errorf("run(%v, %v): exit code %d, want 2", tc.args, tc.vars, code)
		}
		if strings.Contains(err.Error(), "connect") || out.Len() > 0 {
			t.Errorf("run(%v, %v) did something before refusing: %v; output %q", tc.args, tc.vars, err, out.String())
		}
	}
}

// TestHelpAndVersion: help on every command, with the variables it reads, and a version; none of them opens
// anything (DATABASE_URL points nowhere, and provider --help must not bind its port).
func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	vars := env(map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none?sslmode=disable"})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "Commands:"},
		{[]string{"-h"}, "Commands:"},
		{[]string{"help"}, "Commands:"},
		{[]string{"help", "serve"}, "API_KEYS"},
		{[]string{"serve", "--help"}, "OPERATION_LEASE"},
		{[]string{"serve", "--help"}, "DEPLOY_MAX_RUNNING_PER_ACCOUNT"},
		{[]string{"serve", "--help"}, "DEPLOY_QUEUE_TIMEOUT"},
		{[]string{"migrate", "--help"}, "DATABASE_URL"},
		{[]string{"provider", "-h"}, "PROVIDER_ADDR"},
		{[]string{"--version"}, "retrysafe "},
		{[]string{"version"}, "retrysafe "},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), tc.args, vars, &out); err != nil {
			t.Errorf("run(%v) = %v", tc.args, err)
			continue
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("run(%v) printed %q, want it to mention %q", tc.args, out.String(), tc.want)
		}
	}
}

// TestDemoModeListensOnLoopbackOnly: with API_KEYS unset the published demo keys are in use, so every listener,
// the provider sandbox's too, is on 127.0.0.1; API_KEYS set leaves the addresses as given.
func TestDemoModeListensOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(env(map[string]string{"TICKETS_ADDR": "0.0.0.0:9001", "DEPLOYS_ADDR": "[::1]:9003"}))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.DemoKeys || cfg.TicketsAddr != "127.0.0.1:9001" || cfg.PaymentsAddr != "127.0.0.1:8082" ||
		cfg.DeploysAddr != "[::1]:9003" || cfg.ProviderAddr != "127.0.0.1:8090" {
		t.Errorf("demo mode listens on %s %s %s %s", cfg.TicketsAddr, cfg.PaymentsAddr, cfg.DeploysAddr, cfg.ProviderAddr)
	}
	cfg, err = loadConfig(env(map[string]string{"DEMO_LISTEN_ANY": "true", "TICKETS_ADDR": ":9001"}))
	if err != nil || cfg.TicketsAddr != ":9001" {
		t.Errorf("demo mode with DEMO_LISTEN_ANY (a container): %s, %v", cfg.TicketsAddr, err)
	}
	cfg, err = loadConfig(env(map[string]string{"API_KEYS": "a:agent:" + testSecret, "API_KEY_ID_SECRET": testIDSecret}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DemoKeys || cfg.TicketsAddr != ":8081" || cfg.ProviderAddr != ":8090" {
		t.Errorf("with API_KEYS: %s %s", cfg.TicketsAddr, cfg.ProviderAddr)
	}
}

func TestConfigMasksSecrets(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(env(map[string]string{
		"DATABASE_URL": "postgres://app:hunter2@db:5432/retrysafe", "API_KEYS": "a:agent:s3cret-0123456789abcdefghij,a:approver:t0p-0123456789abcdefghijkl",
		"API_KEY_ID_SECRET": testIDSecret,
	}))
	if err != nil {
		t.Fatal(err)
	}
	printed := cfg.String()
	for _, secret := range []string{"hunter2", "s3cret", "t0p", testIDSecret} {
		if strings.Contains(printed, secret) {
			t.Errorf("config prints %q: %s", secret, printed)
		}
	}
	if cfg.IdempotencyRetention != 72*time.Hour || cfg.TicketsAddr != ":8081" || cfg.PaymentsAddr != ":8082" || cfg.DeploysAddr != ":8083" {
		t.Errorf("defaults differ from docs/contract.md: %+v", cfg)
	}
}

// TestComposeFileMatchesTheContract checks docker-compose.yml where no Docker engine runs: it parses, and it
// publishes the ports and runs the commands the README promises.
func TestComposeFileMatchesTheContract(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Build       any               `yaml:"build"`
			Image       string            `yaml:"image"`
			Command     []string          `yaml:"command"`
			Ports       []string          `yaml:"ports"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	app, ok := compose.Services["retrysafe"]
	if !ok || strings.Join(app.Command, " ") != "serve all" {
		t.Fatalf("retrysafe service = %+v", app)
	}
	if got := strings.Join(app.Ports, ","); got != "127.0.0.1:8081:8081,127.0.0.1:8082:8082,127.0.0.1:8083:8083" {
		t.Errorf("ports = %s", got)
	}
	if !strings.HasPrefix(app.Environment["DATABASE_URL"], "postgres://") || app.Environment["PROVIDER_URL"] != "http://provider:8090" {
		t.Errorf("environment = %v", app.Environment)
	}
	if p := compose.Services["provider"]; strings.Join(p.Command, " ") != "provider" || strings.Join(p.Ports, ",") != "127.0.0.1:8090:8090" {
		t.Errorf("provider service = %+v", p)
	}
	if compose.Services["postgres"].Image == "" {
		t.Error("no postgres service")
	}
}

// TestReadyOnlyAfterMigrate: with MIGRATE_ON_START=false on an empty database the process is healthy but not
// ready, nor with the library's migrations alone; `retrysafe migrate` (both sequences) makes it ready.
func TestReadyOnlyAfterMigrate(t *testing.T) {
	t.Parallel()
	dsn := testdb.EmptySchema(t)
	addr := proctest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "tickets"}, env(map[string]string{
			"DATABASE_URL": dsn, "TICKETS_ADDR": addr, "MIGRATE_ON_START": "false", "LOG_LEVEL": "error",
		}), &syncWriter{w: &out})
	}()
	base := "http://" + addr
	waitHealthy(t, base+"/healthz", done)
	if resp, err := http.Get(base + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz before migrating: %v %v", resp, err)
	}
	// The library's tables alone are not enough for the demo services: their own sequence is still pending.
	sqlDB, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	if err := migrations.Up(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get(base + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz with only the library's migrations: %v %v", resp, err)
	}
	if err := run(context.Background(), []string{"migrate"}, env(map[string]string{"DATABASE_URL": dsn, "LOG_LEVEL": "error"}), &out); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	waitHealthy(t, base+"/readyz", done)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestConfigDatabaseBounds(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(env(nil))
	if err != nil || cfg.DBConnectTimeout != 3*time.Second || cfg.DBAcquireTimeout != 3*time.Second || cfg.DBStatementTimeout != 5*time.Second {
		t.Fatalf("defaults = %s %s %s, %v", cfg.DBConnectTimeout, cfg.DBAcquireTimeout, cfg.DBStatementTimeout, err)
	}
	cfg, err = loadConfig(env(map[string]string{"DB_CONNECT_TIMEOUT": "1s", "DB_ACQUIRE_TIMEOUT": "2s", "DB_STATEMENT_TIMEOUT": "10s"}))
	if err != nil || cfg.DBConnectTimeout != time.Second || cfg.DBAcquireTimeout != 2*time.Second || cfg.DBStatementTimeout != 10*time.Second {
		t.Fatalf("set = %s %s %s, %v", cfg.DBConnectTimeout, cfg.DBAcquireTimeout, cfg.DBStatementTimeout, err)
	}
	if _, err := loadConfig(env(map[string]string{"DB_STATEMENT_TIMEOUT": "0s"})); err == nil {
		t.Fatal("a zero statement timeout was accepted")
	}
}
