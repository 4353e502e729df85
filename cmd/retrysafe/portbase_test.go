package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/services/provider"
)

// TestPortBaseMovesTheWholeDemo runs the demo as `make run` does (the provider and `serve all`, with nothing set
// but RETRYSAFE_PORT_BASE and the database) while something answers on the default ports, then an agent that
// is given only the same base. The agent's payment intent must reach the moved payments, payments the moved
// provider (its authorization counted there), and nothing may reach the default ports.
func TestPortBaseMovesTheWholeDemo(t *testing.T) {
	t.Parallel()
	var strays atomic.Int32
	for _, port := range []int{8081, 8082, 8083, 8090} {
		occupy(t, port, &strays)
	}
	base := freePortBase(t)
	url := func(offset int) string { return fmt.Sprintf("http://127.0.0.1:%d", base+offset) }
	db := testdb.Schema(t)
	moved := map[string]string{"RETRYSAFE_PORT_BASE": strconv.Itoa(base), "LOG_LEVEL": "warn"}
	startRun(t, []string{"provider"}, moved, url(providerPort)+"/healthz")
	startRun(t, []string{"serve", "all"}, map[string]string{
		"RETRYSAFE_PORT_BASE": strconv.Itoa(base), "DATABASE_URL": db.DSN, "DB_MAX_CONNS": "4", "LOG_LEVEL": "warn",
	}, url(paymentsPort)+"/readyz")
	for _, offset := range []int{ticketsPort, deploysPort} {
		waitHealthy(t, url(offset)+"/readyz", nil)
	}

	bin := proctest.Build(t)
	agentRun := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "RETRYSAFE_PORT_BASE=" + strconv.Itoa(base),
			"AGENT_API_KEY=" + servicetest.AgentSecret, "AGENT_MAX_WAIT=30s"}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		return out.String() + errOut.String(), err
	}
	journal := t.TempDir() + "/agent.journal"
	if out, err := agentRun("agent", "do", "--journal", journal, "--action", "pi-moved",
		"create_payment_intent", `{"order_id":"order-moved","amount":"25.00","currency":"USD"}`); err != nil {
		t.Fatalf("agent do: %v\n%s", err, out)
	}
	if out, err := agentRun("agent", "do", "--journal", journal, "--action", "ticket-moved",
		"create_ticket", `{"project":"ops","title":"moved"}`); err != nil {
		t.Fatalf("agent do: %v\n%s", err, out)
	}
	counters, err := provider.NewClient(url(providerPort), "retrysafe-payments-sandbox", 5*time.Second).Counters(t.Context())
	if err != nil || counters[string(provider.KindAuthorize)] != 1 {
		t.Errorf("moved provider's authorizations = %v, %v; want 1", counters, err)
	}
	var tickets int
	if err := db.Raw("SELECT count(*) FROM tickets WHERE title = 'moved'").Scan(&tickets).Error; err != nil || tickets != 1 {
		t.Errorf("tickets made through the moved demo = %d, %v; want 1", tickets, err)
	}
	if n := strays.Load(); n != 0 {
		t.Errorf("%d requests reached the default ports", n)
	}

	out, err := agentRun("env")
	for _, want := range []string{"TICKETS_URL='" + url(ticketsPort) + "'", "PROVIDER_URL='" + url(providerPort) + "'",
		fmt.Sprintf("RETRYSAFE_PORT_BASE='%d'", base), fmt.Sprintf("KILL_HOOK_PORT='%d'", base+killHookPort)} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("retrysafe env = %q, %v; want %s in it", out, err, want)
		}
	}
}

// occupy answers on 127.0.0.1:port, counting what reaches it, while the test runs; a port already taken by
// another process is left to it (it is taken either way).
func occupy(t *testing.T, port int, hits *atomic.Int32) {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusTeapot)
	}))
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
}

// freePortBase finds a base whose demo ports are all free, below the kernel's ephemeral range so that no
// other test's FreeAddr takes one meanwhile.
func freePortBase(t *testing.T) int {
	t.Helper()
	for range 50 {
		base := 20000 + rand.IntN(10000)
		free := true
		for offset := 1; offset <= maxPortOffset && free; offset++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+offset))
			if err != nil {
				free = false
				continue
			}
			ln.Close()
		}
		if free {
			return base
		}
	}
	t.Fatal("no free port base")
	return 0
}

// TestEnvLine: retrysafe env prints one line a shell can eval, carrying the demo's database unless its URL holds
// a password (that stays out of terminals and scrollback).
func TestEnvLine(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		db     string
		wantDB bool
	}{
		{"postgres://postgres@127.0.0.1:54329/retrysafe?sslmode=disable", true},
		{"postgres://app:s3cret@db.internal/retrysafe", false},
	} {
		var out bytes.Buffer
		if err := run(t.Context(), []string{"env"}, env(map[string]string{"DATABASE_URL": tt.db}), &out); err != nil {
			t.Fatal(err)
		}
		line := out.String()
		if strings.Count(line, "\n") != 1 || !strings.HasPrefix(line, "export RETRYSAFE_PORT_BASE='8080' TICKETS_URL='http://127.0.0.1:8081'") {
			t.Errorf("retrysafe env = %q; want one export line of the default demo", line)
		}
		if got := strings.Contains(line, "DATABASE_URL="); got != tt.wantDB || strings.Contains(line, "s3cret") {
			t.Errorf("retrysafe env with %s = %q; want DATABASE_URL printed: %v, no password", tt.db, line, tt.wantDB)
		}
	}
}
