// Package proctest runs the real retrysafe binary as a subprocess, for tests that must kill a process (SIGKILL
// at a failpoint) or talk to another process over HTTP (the payment provider sandbox).
//
//	bin := proctest.Build(t)
//	p := proctest.Start(t, bin, []string{"serve", "tickets"}, map[string]string{
//		"DATABASE_URL": db.DSN, "RETRYSAFE_FAILPOINTS": "idem.after_claim=pause",
//	}, "TICKETS_ADDR")
//	... send a request in a goroutine ...
//	p.WaitFor(t, "failpoint idem.after_claim reached")
//	p.Kill(t)
package proctest

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Build compiles cmd/retrysafe once per test binary and returns its path.
func Build(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "retrysafe-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "retrysafe")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/retrysafe")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("proctest: %v", buildErr)
	}
	return binPath
}

// FreeAddr returns a loopback address with a free port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Process is a running retrysafe subprocess.
type Process struct {
	URL string
	cmd *exec.Cmd

	mu     sync.Mutex
	lines  []string
	notify chan struct{}
	done   chan struct{}
}

// Start runs bin with args and env (on top of a minimal environment), on a free port given to it through the
// variable addrVar, and waits until GET /healthz answers. The process is killed when the test ends.
func Start(t testing.TB, bin string, args []string, env map[string]string, addrVar string) *Process {
	t.Helper()
	addr := FreeAddr(t)
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), addrVar + "=" + addr, "LOG_LEVEL=warn"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &Process{URL: "http://" + addr, cmd: cmd, notify: make(chan struct{}, 1), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("proctest: start %v: %v", args, err)
	}
	var readers sync.WaitGroup
	for _, r := range []interface{ Read([]byte) (int, error) }{stdout, stderr} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64*1024), 1024*1024)
			for sc.Scan() {
				p.mu.Lock()
				p.lines = append(p.lines, sc.Text())
				p.mu.Unlock()
				select {
				case p.notify <- struct{}{}:
				default:
				}
			}
		}()
	}
	go func() {
		readers.Wait()
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("output of %v:\n%s", args, p.Output())
		}
	})
	p.waitHealthy(t)
	return p
}

// StartReplicas starts n copies of one process, each on its own free port (replicas of a service on one
// database, say), and returns them in start order.
func StartReplicas(t testing.TB, bin string, n int, args []string, env map[string]string, addrVar string) []*Process {
	t.Helper()
	ps := make([]*Process, n)
	for i := range ps {
		ps[i] = Start(t, bin, args, env, addrVar)
	}
	return ps
}

func (p *Process) waitHealthy(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			t.Fatalf("proctest: process exited before it was healthy:\n%s", p.Output())
		default:
		}
		resp, err := http.Get(p.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("proctest: not healthy after 30s:\n%s", p.Output())
}

// WaitFor waits up to 30 s for a line of output containing s.
func (p *Process) WaitFor(t testing.TB, s string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if strings.Contains(p.Output(), s) {
			return
		}
		select {
		case <-p.notify:
		case <-time.After(50 * time.Millisecond):
		case <-p.done:
			if strings.Contains(p.Output(), s) {
				return
			}
			t.Fatalf("proctest: process exited without printing %q:\n%s", s, p.Output())
		case <-deadline:
			t.Fatalf("proctest: %q not printed within 30s:\n%s", s, p.Output())
		}
	}
}

// Kill sends SIGKILL and waits for the process to be gone: no deferred code, no graceful shutdown runs.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("proctest: kill: %v", err)
	}
	<-p.done
}

// Output is everything the process printed so far.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}
