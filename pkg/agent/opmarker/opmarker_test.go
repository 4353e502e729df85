package opmarker_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/agent/opmarker"
)

func countLines(t *testing.T, path string) int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return bytes.Count(raw, []byte("\n"))
}

// A second run with the same id returns the first run's output and exit code and does not run the command.
func TestSecondRunReturnsTheRecordedResult(t *testing.T) {
	dir, work := filepath.Join(t.TempDir(), "markers"), t.TempDir()
	ledger := filepath.Join(work, "ledger")
	argv := []string{"sh", "-c", `echo paid >> "$1"; echo done; exit 3`, "sh", ledger}
	var out1, out2, errs bytes.Buffer
	st := opmarker.Run(dir, "idk_1", "aop_1", argv, nil, &out1, &errs)
	if st.State != opmarker.Ran || st.ExitCode != 3 || out1.String() != "done\n" {
		t.Fatalf("first run %+v %q", st, out1.String())
	}
	st = opmarker.Run(dir, "idk_1", "aop_2", argv, nil, &out2, &errs)
	if st.State != opmarker.Replayed || st.ExitCode != 3 || out2.String() != "done\n" {
		t.Fatalf("second run %+v %q", st, out2.String())
	}
	if n := countLines(t, ledger); n != 1 {
		t.Fatalf("the command ran %d times", n)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "idk_1.marker"))
	if !strings.Contains(string(raw), `"operation_id":"aop_1"`) {
		t.Fatalf("marker %s: want the first operation's id", raw)
	}
}

// Runs racing for one id: exactly one runs the command; the others report it in progress or replay it.
func TestRacingRunsRunOnce(t *testing.T) {
	dir, work := filepath.Join(t.TempDir(), "markers"), t.TempDir()
	ledger := filepath.Join(work, "ledger")
	var wg sync.WaitGroup
	states := make([]string, 8)
	for i := range states {
		wg.Go(func() {
			states[i] = opmarker.Run(dir, "idk_race", "", []string{"sh", "-c", `echo x >> "$1"`, "sh", ledger}, nil, io.Discard, io.Discard).State
		})
	}
	wg.Wait()
	ran := 0
	for _, s := range states {
		switch s {
		case opmarker.Ran:
			ran++
		case opmarker.Replayed, opmarker.InProgress:
		default:
			t.Fatalf("state %s", s)
		}
	}
	if n := countLines(t, ledger); ran != 1 || n != 1 {
		t.Fatalf("%d runs ran, the command ran %d times; want 1 and 1 (%v)", ran, n, states)
	}
}

// A marker without a result (a run that died mid-way) is reported, and nothing runs.
func TestMarkerWithoutResultIsInProgress(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "idk_3.marker"), []byte(`{"id":"idk_3","pid":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	flag := filepath.Join(t.TempDir(), "ran")
	st := opmarker.Run(dir, "idk_3", "", []string{"touch", flag}, nil, io.Discard, io.Discard)
	if st.State != opmarker.InProgress || st.ExitCode != opmarker.ExitInProgress {
		t.Fatalf("%+v", st)
	}
	if _, err := os.Stat(flag); err == nil {
		t.Fatal("the command ran")
	}
}

// Main writes the status line last on standard error; ParseStatus reads it back and strips it.
func TestMainStatusLine(t *testing.T) {
	var out, errs bytes.Buffer
	code := opmarker.Main([]string{"--dir", t.TempDir(), "--id", "idk_4", "--", "sh", "-c", "echo oops >&2; exit 4"}, nil, &out, &errs)
	st, rest, ok := opmarker.ParseStatus(errs.Bytes())
	if code != 4 || !ok || st.State != opmarker.Ran || st.ExitCode != 4 || strings.TrimSpace(string(rest)) != "oops" {
		t.Fatalf("code %d, status %+v %v, rest %q", code, st, ok, rest)
	}
	for _, args := range [][]string{{"--dir", "relative", "--id", "x", "--", "true"}, {"--dir", "/tmp", "--id", "../x", "--", "true"}} {
		if code := opmarker.Main(args, nil, io.Discard, io.Discard); code != opmarker.ExitRefused {
			t.Errorf("%v: exit %d, want %d", args, code, opmarker.ExitRefused)
		}
	}
}
