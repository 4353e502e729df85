// Package scripts holds the tests of the shell scripts beside it.
package scripts

import (
	"context"
	"database/sql"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// TestDevDBInAPrivateCloneAsRoot is `make run` as root from a clone that the postgres user cannot enter (a
// `mktemp -d`, or root's home), with no PostgreSQL on the system port: devdb.sh must start a project-local
// cluster that answers, with its data where postgres can reach it, not fail in initdb.
func TestDevDBInAPrivateCloneAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("as root only: then the cluster runs as postgres, who cannot enter a private clone")
	}
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) == 0 {
		t.Skip("no initdb installed (devdb.sh would install it with apt)")
	}
	clone := t.TempDir() // mode 0700, owned by root
	script := filepath.Join(clone, "scripts", "devdb.sh")
	src, err := os.ReadFile("devdb.sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, src, 0o755); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	env := append(os.Environ(), "RETRYSAFE_PG_PORT="+port, "RETRYSAFE_PG_SYSTEM_PORT="+freePort(t), "RETRYSAFE_PG_DATA=")
	devdb := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
		cmd.Env = env
		cmd.Dir = clone
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", &scriptError{args, err, stderr.String()}
		}
		return strings.TrimSpace(string(out)), nil
	}
	t.Cleanup(func() {
		if _, err := devdb("stop"); err != nil {
			t.Error(err)
		}
		if dir, err := devdb("dir"); err == nil && !strings.HasPrefix(dir, clone) {
			os.RemoveAll(dir)
		}
	})

	url, err := devdb("url")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := devdb("dir")
	if err != nil {
		t.Fatal(err)
	}
	if want := "postgres://postgres@127.0.0.1:" + port; url != want {
		t.Fatalf("url = %q; want %q", url, want)
	}
	db, err := sql.Open("pgx", url+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var dataDir string
	if err := db.QueryRow(`SHOW data_directory`).Scan(&dataDir); err != nil {
		t.Fatalf("the cluster does not answer: %v", err)
	}
	if dataDir != dir {
		t.Errorf("the cluster's data directory is %s; devdb.sh dir says %s", dataDir, dir)
	}
	if strings.HasPrefix(dataDir, clone) {
		t.Errorf("the cluster's data directory %s is inside the private clone %s", dataDir, clone)
	}
}

type scriptError struct {
	args   []string
	err    error
	stderr string
}

func (e *scriptError) Error() string {
	return "devdb.sh " + strings.Join(e.args, " ") + ": " + e.err.Error() + "\n" + e.stderr
}

// freePort is a TCP port nothing listens on right now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}
