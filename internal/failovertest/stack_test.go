package failovertest

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/services/provider"
)

// appName is the application_name of the services' connections, so that a node's pg_stat_activity tells
// whether they are connected to it.
const appName = "retrysafe-failover"

const merchantSecret = "sk_test_failover"

// stack is the provider sandbox and the three services, each its own process on the cluster's multi-host URL.
type stack struct {
	bin      string
	tickets  *apitest.Client
	payments *apitest.Client
	deploys  *apitest.Client
	provider *provider.Client
	// providerURL is the provider sandbox, for `retrysafe payments-sweep`.
	providerURL string
	// target is the simulated deploy target's database: on the machine's PostgreSQL, not the cluster, so that
	// a failover does not roll it back, as it would not roll back a remote system.
	target *pgx.Conn
}

func startStack(t *testing.T, c *cluster) *stack {
	t.Helper()
	bin := proctest.Build(t)
	url := c.url() + "&application_name=" + appName
	targetURL, target := targetDatabase(t, filepath.Base(c.dir))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	migrate := exec.CommandContext(ctx, bin, "migrate")
	migrate.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "DEPLOY_TARGET_DATABASE_URL=" + targetURL, "LOG_LEVEL=warn"}
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("retrysafe migrate: %v\n%s", err, out)
	}
	prov := proctest.Start(t, bin, []string{"provider"}, nil, "PROVIDER_ADDR")
	env := map[string]string{
		"DATABASE_URL": url, "DEPLOY_TARGET_DATABASE_URL": targetURL, "MIGRATE_ON_START": "false", "DB_MAX_CONNS": "8", "RATE_LIMIT_WRITES_PER_SECOND": "0",
		"PROVIDER_URL": prov.URL, "PROVIDER_SECRET": merchantSecret, "PROVIDER_TIMEOUT": "2s",
		// A lease lost with the old primary, or cut by it, ends within seconds, and the recovery worker settles
		// its operation soon after.
		"OPERATION_LEASE": "10s", "RECOVERY_INTERVAL": "1s",
		"DEPLOY_STEPS": "2", "DEPLOY_STEP_DURATION": "100ms", "DEPLOY_POLL_INTERVAL": "200ms",
		"DEPLOY_HEARTBEAT_INTERVAL": "1s", "DEPLOY_LOCK_LEASE": "30s", "DEPLOY_WORKERS": "4",
		"DEPLOY_MAX_RUNNING_PER_ACCOUNT": "8", "AUDIT_SEAL_INTERVAL": "200ms",
		// The sweep reads the timeline every second: after the promotion it restores what the old primary took.
		"PAYMENTS_SWEEP_INTERVAL": "1m", "PAYMENTS_SWEEP_CHECK": "1s",
	}
	client := func(args []string, addrVar string) *apitest.Client {
		c := apitest.New(t, proctest.Start(t, bin, args, env, addrVar).URL, servicetest.AgentSecret)
		c.HTTP.Timeout = 20 * time.Second
		return c
	}
	return &stack{
		bin:         bin,
		tickets:     client([]string{"serve", "tickets"}, "TICKETS_ADDR"),
		payments:    client([]string{"serve", "payments"}, "PAYMENTS_ADDR"),
		deploys:     client([]string{"serve", "deploys"}, "DEPLOYS_ADDR"),
		provider:    provider.NewClientHTTP(prov.URL, merchantSecret, apitest.HTTPClient(t, 5*time.Second)),
		providerURL: prov.URL,
		target:      target,
	}
}

// targetDatabase creates a database named after the cluster on the machine's PostgreSQL (TEST_DATABASE_URL's
// server) for the deploy target, and drops it when the test ends: its URL, and a connection to it.
func targetDatabase(t *testing.T, cluster string) (string, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("the machine's PostgreSQL (%s:%d): %v", cfg.Host, cfg.Port, err)
	}
	defer admin.Close(context.Background())
	name := "retrysafe_failover_target_" + strings.NewReplacer("-", "_").Replace(cluster)
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_, err = admin.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
			admin.Close(ctx)
		}
		if err != nil {
			t.Errorf("drop the deploy target's database %s: %v", name, err)
		}
	})
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return u.String(), conn
}

// auditVerify runs `retrysafe audit verify` on the database at url: its output, and whether it exited 0 (every
// chain intact).
func (s *stack) auditVerify(t *testing.T, url string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, "audit", "verify")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "LOG_LEVEL=warn"}
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}
