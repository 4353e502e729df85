package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
)

// TestKillAfterClaimCommand runs conformance case 7 as docs/conformance.md does, with nothing but shipped
// commands: `kill-after-claim --start` starts tickets with the failpoint armed through the environment alone,
// the request file's kill_hook is `kill-after-claim`, and the case must pass with exactly one ticket made.
func TestKillAfterClaimCommand(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t)
	db := testdb.Schema(t)
	addr := proctest.FreeAddr(t)
	state := t.TempDir()
	health := "http://" + addr + "/readyz"
	service := []string{bin, "serve", "tickets"}
	hook := append([]string{bin, "kill-after-claim", "--state", state, "--health", health, "--"}, service...)
	environ := append(os.Environ(), "DATABASE_URL="+db.DSN, "MIGRATE_ON_START=false", "TICKETS_ADDR="+addr,
		"LOG_LEVEL=warn", "RETRYSAFE_TOKEN="+servicetest.AgentSecret)
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(state, "service.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	start := exec.Command(hook[0], append([]string{hook[1], "--start"}, hook[2:]...)...)
	start.Env = environ
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("kill-after-claim --start: %v\n%s", err, out)
	}
	spec, err := os.ReadFile("../../examples/conformance/tickets.json")
	if err != nil {
		t.Fatal(err)
	}
	request := filepath.Join(t.TempDir(), "tickets-kill.json")
	withHook := strings.Replace(string(spec), "{", `{"kill_hook": "`+strings.Join(hook, " ")+`",`, 1)
	if err := os.WriteFile(request, []byte(withHook), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := exec.Command(bin, "conformance", "--target", "http://"+addr, "--request", request, "--cases", "7")
	conf.Env = environ
	out, err := conf.CombinedOutput()
	if err != nil || !regexp.MustCompile(`7 worker killed after claim +pass`).Match(out) {
		t.Fatalf("conformance case 7 with the shipped kill hook: %v\n%s", err, out)
	}
	var tickets int64
	if err := db.Table("tickets").Count(&tickets).Error; err != nil || tickets != 1 {
		t.Errorf("%d tickets, %v; want exactly 1", tickets, err)
	}
}
