//go:build unix

package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// TestToolsFileNotRegular: a tools file is a regular file within the size limit; a device that never ends
// (/dev/zero), a pipe that may never answer, a directory, or a file over the limit is refused before it is read.
func TestToolsFileNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "tools.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("tools: []\n#"+strings.Repeat("x", 1<<20)), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"/dev/zero": "/dev/zero: not a regular file (Dc---------)",
		fifo:        "not a regular file (p---------)",
		dir:         "not a regular file (d---------)",
		big:         "larger than 1048576 bytes",
	} {
		var err error
		n := allocated(func() { _, err = agent.LoadTools(path) })
		if !errors.Is(err, agent.ErrToolsFile) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an ErrToolsFile saying %q", path, err, want)
		}
		if n > 1<<20 {
			t.Errorf("%s: refusing it allocated %d KiB", path, n>>10)
		}
	}
}
