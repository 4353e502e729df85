package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/testdb"
)

// tsClientDir is the TypeScript client generated from api/openapi.yaml (openapi-typescript + openapi-fetch).
const tsClientDir = "../../api/ts"

// TestTypeScriptClient shows the spec serves callers outside Go: it starts tickets (run, on a test schema) and runs
// the node tests of api/ts against it, which create a ticket, replay it and read the 422 problem through the
// generated client, and check that the committed types are what the spec generates. Node and npm are required:
// without them the test fails (CI installs them); -short skips it.
func TestTypeScriptClient(t *testing.T) {
	nodeTests(t, tsClientDir)
	t.Parallel()
	_, base, out := serveTickets(t, "acct_ts")

	test := exec.Command("npm", "test")
	test.Dir = tsClientDir
	test.Env = append(os.Environ(), "RETRYSAFE_TICKETS_URL="+base, "RETRYSAFE_API_KEY="+testSecret)
	if output, err := test.CombinedOutput(); err != nil {
		t.Fatalf("npm test in api/ts: %v\n%s\nservice log:\n%s", err, output, out.String())
	}
}

// mcpTSDir drives `retrysafe mcp` with the official TypeScript MCP SDK client (@modelcontextprotocol/sdk).
const mcpTSDir = "../../api/mcp-ts"

// TestMCPTypeScriptClient: the official TypeScript MCP SDK client, as an MCP host runs it, against the built
// binary's `retrysafe mcp` and a real tickets service: it lists the tools, calls create_ticket, kills the server
// mid-call and calls again with the same action_id on a new server (api/mcp-ts/test). One ticket. Node and npm
// are required as for TestTypeScriptClient; -short skips it.
func TestMCPTypeScriptClient(t *testing.T) {
	nodeTests(t, mcpTSDir)
	t.Parallel()
	bin := proctest.Build(t)
	db, base, out := serveTickets(t, "acct_mcpts")

	const title = "from the TypeScript MCP client"
	test := exec.Command("npm", "test")
	test.Dir = mcpTSDir
	test.Env = append(os.Environ(), "RETRYSAFE_BIN="+bin, "RETRYSAFE_JOURNAL="+filepath.Join(t.TempDir(), "mcp-ts.journal"),
		"RETRYSAFE_TICKET_TITLE="+title, "TICKETS_URL="+base, "AGENT_API_KEY="+testSecret)
	if output, err := test.CombinedOutput(); err != nil {
		t.Fatalf("npm test in api/mcp-ts: %v\n%s\nservice log:\n%s", err, output, out.String())
	}
	var n int
	if err := db.Raw(`SELECT count(*) FROM tickets WHERE title = ?`, title).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d tickets after two calls with one action_id and a kill between them; want 1", n)
	}
}

// nodeTests skips t under -short, fails it without node and npm (CI installs them), and installs dir's locked
// packages.
func nodeTests(t *testing.T, dir string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: the node tests of %s need node, npm and their packages", dir)
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: the node tests of %s need Node.js 18 or later and npm "+
				"(Debian: apt-get install nodejs npm; .ci/run installs them)", tool, dir)
		}
	}
	npmCI(t, dir)
}

// serveTickets runs the tickets service (run) on a test schema, with one agent key of account and testSecret,
// until t ends, and returns the schema, its base URL and its log.
func serveTickets(t *testing.T, account string) (*testdb.DB, string, *bytes.Buffer) {
	t.Helper()
	db := testdb.Schema(t)
	addr := proctest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	out := &bytes.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "tickets"}, env(map[string]string{
			"DATABASE_URL": db.DSN, "TICKETS_ADDR": addr, "API_KEYS": account + ":agent:" + testSecret,
			"API_KEY_ID_SECRET": testIDSecret, "LOG_LEVEL": "error",
		}), &syncWriter{w: out})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(15 * time.Second): // or waitHealthy already took run's early return
		}
	})
	base := "http://" + addr
	waitHealthy(t, base+"/readyz", done)
	return db, base, out
}

// npmCI installs dir's locked packages (package-lock.json) unless node_modules already holds them: npm records
// what it installed in node_modules/.package-lock.json, newer than the lock file it came from.
func npmCI(t *testing.T, dir string) {
	t.Helper()
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if installed, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && installed.ModTime().After(lock.ModTime()) {
		return
	}
	ci := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	ci.Dir = dir
	start := time.Now()
	if output, err := ci.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, output)
	}
	t.Logf("npm ci in %s took %s", dir, time.Since(start).Round(time.Millisecond))
}
