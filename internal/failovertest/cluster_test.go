package failovertest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// cluster is a primary and a standby of scripts/failover.sh, in a directory and on ports of their own.
type cluster struct {
	t      *testing.T
	dir    string
	script string
	env    []string
}

// startCluster starts a cluster in mode sync or async, with the database retrysafe, and stops it when the test
// ends, however it ends. The directory is under RETRYSAFE_FAILOVER_ROOT when set: make test-failover stops
// whatever a test killed by its timeout left there.
func startCluster(t *testing.T, mode string) *cluster {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := os.Getenv("RETRYSAFE_FAILOVER_ROOT")
	if root == "" {
		root = os.TempDir()
	}
	portA, portB := freePort(t), freePort(t)
	for portB == portA {
		portB = freePort(t)
	}
	dir := filepath.Join(root, fmt.Sprintf("%s-%d", mode, time.Now().UnixNano()))
	c := &cluster{t: t, dir: dir, script: filepath.Join(filepath.Dir(file), "..", "..", "scripts", "failover.sh"), env: append(os.Environ(),
		"FAILOVER_DIR="+dir,
		"FAILOVER_PORT_A="+strconv.Itoa(portA), "FAILOVER_PORT_B="+strconv.Itoa(portB))}
	// Before the start: a start that fails half way is stopped too.
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"a.log", "b.log", "a.rewind.log", "b.rewind.log"} {
				if log, err := os.ReadFile(filepath.Join(c.dir, name)); err == nil {
					t.Logf("%s (last 4 KB):\n%s", name, log[max(0, len(log)-4096):])
				}
			}
		}
		if out, err := c.run("stop"); err != nil {
			t.Errorf("failover.sh stop: %v\n%s", err, out)
		}
	})
	c.must("start", mode)
	c.must("createdb", "retrysafe")
	return c
}

// freePort is a free port on 127.0.0.1 below Linux's ephemeral range, where no outgoing connection takes it
// between this check and the node's start.
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 20000 + rand.IntN(10000)
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			ln.Close()
			return p
		}
	}
	t.Fatal("no free port in 20000-29999")
	return 0
}

// run runs failover.sh with args; it returns its standard output, and its standard error with the error.
func (c *cluster) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...)
	cmd.Env = c.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, stderr.String())
	}
	return stdout.String(), nil
}

func (c *cluster) must(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("failover.sh %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(out)
}

// url is the multi-host URL of the database retrysafe.
func (c *cluster) url() string { return c.must("url", "retrysafe") }

// kill kills the primary (failover.sh kill) and returns the moment it did.
func (c *cluster) kill() time.Time {
	c.t.Helper()
	out := c.must("kill")
	sec, frac, _ := strings.Cut(out, ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	ns, err2 := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	if err1 != nil || err2 != nil {
		c.t.Fatalf("failover.sh kill printed %q; want the moment of the kill", out)
	}
	return time.Unix(s, ns)
}

// node is one node as failover.sh status reports it.
type node struct {
	name string
	port string
	role string // primary, standby or down
}

func (c *cluster) nodes() map[string]node {
	c.t.Helper()
	out := map[string]node{}
	for _, line := range strings.Split(c.must("status"), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 {
			out[f[2]] = node{name: f[0], port: f[1], role: f[2]}
		}
	}
	return out
}

// connect opens a connection to the database retrysafe on the node that has role.
func (c *cluster) connect(role string) (*pgx.Conn, node) {
	c.t.Helper()
	n, ok := c.nodes()[role]
	if !ok {
		c.t.Fatalf("no node is %s: %v", role, c.nodes())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.url())
	if err != nil {
		c.t.Fatalf("connect to the %s (node %s): %v", role, n.name, err)
	}
	c.t.Cleanup(func() { conn.Close(context.Background()) })
	return conn, n
}

func (n node) url() string {
	return "postgres://postgres@127.0.0.1:" + n.port + "/retrysafe?sslmode=disable"
}
