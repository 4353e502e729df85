package failovertest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
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
}

func startStack(t *testing.T, c *cluster) *stack {
	t.Helper()
	bin := proctest.Build(t)
	url := c.url() + "&application_name=" + appName
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	migrate := exec.CommandContext(ctx, bin, "migrate")
	migrate.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "LOG_LEVEL=warn"}
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("retrysafe migrate: %v\n%s", err, out)
	}
	prov := proctest.Start(t, bin, []string{"provider"}, nil, "PROVIDER_ADDR")
	env := map[string]string{
		"DATABASE_URL": url, "MIGRATE_ON_START": "false", "DB_MAX_CONNS": "8", "RATE_LIMIT_WRITES_PER_SECOND": "0",
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
	}
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
