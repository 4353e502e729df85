// Package opmarker is the host side of a command an agent may send twice: it runs the command once per
// operation id, and tells a second run what the first one did instead of doing it again.
//
// An agent that lost its SSH connection after a command started cannot tell whether the command ran, and
// running it again may append, pay or notify a second time (`a && b` guards one execution, not a second
// connection). The host can tell: before the work, Run creates DIR/ID.marker with O_EXCL, which one run in the
// whole host wins; after it, it writes DIR/ID.result (exit code, output) beside it, atomically. A second run
// with the same id finds the marker and returns the recorded result, or reports that a run started and
// recorded no result (it is still running, or died mid-way), and never runs the command again.
//
// It is `retrysafe marker --dir DIR --id ID [--operation AOP] -- COMMAND...` on the host; the agent wraps an
// effect command of a host with a marker in it, and reads the last line of its standard error, which Run
// writes as StatusPrefix and a Status in JSON.
package opmarker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// StatusPrefix begins the status line Run writes last to standard error.
const StatusPrefix = "retrysafe-marker: "

// States of a Status.
const (
	// Ran: this run created the marker, ran the command and recorded its result.
	Ran = "ran"
	// Replayed: an earlier run recorded a result; the command was not run again, its output and exit code are
	// the recorded ones.
	Replayed = "replayed"
	// InProgress: an earlier run created the marker and recorded no result: it is running, or died mid-way.
	// Nothing was run; a person decides from the host.
	InProgress = "in_progress"
	// Refused: the marker could not be made or read (a bad id, a directory that cannot be written): nothing
	// was run.
	Refused = "refused"
)

// Exit codes of Run besides the command's own.
const (
	ExitInProgress = 75 // EX_TEMPFAIL
	ExitRefused    = 78 // EX_CONFIG
)

// MaxOutputBytes bounds the standard output a result records (and a replay returns); its SHA-256 covers all of it.
const MaxOutputBytes = 1 << 20

// Status is what the status line says.
type Status struct {
	ID          string `json:"id"`
	OperationID string `json:"operation_id,omitempty"`
	State       string `json:"state"`
	Marker      string `json:"marker"`
	ExitCode    int    `json:"exit_code"`
	StartedAt   string `json:"started_at,omitempty"`
	FinishedAt  string `json:"finished_at,omitempty"`
	Detail      string `json:"detail,omitempty"`
}

// marker is the content of ID.marker, written before the work.
type marker struct {
	ID          string `json:"id"`
	OperationID string `json:"operation_id,omitempty"`
	Command     string `json:"command_sha256"`
	Host        string `json:"host"`
	PID         int    `json:"pid"`
	StartedAt   string `json:"started_at"`
}

// result is the content of ID.result, written after the work.
type result struct {
	ID              string `json:"id"`
	OperationID     string `json:"operation_id,omitempty"`
	ExitCode        int    `json:"exit_code"`
	Stdout          []byte `json:"stdout"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StdoutSHA256    string `json:"stdout_sha256"`
	StartedAt       string `json:"started_at"`
	FinishedAt      string `json:"finished_at"`
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// Main is `retrysafe marker`: it parses args (without the command's name) and runs Run, returning the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("marker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "the marker directory (created 0700 when missing)")
	id := fs.String("id", "", "the operation's id on the host: 1 to 128 letters, digits, _ and -")
	op := fs.String("operation", "", "the agent's local operation id, recorded in the marker")
	if err := fs.Parse(args); err != nil {
		return ExitRefused
	}
	st := Run(*dir, *id, *op, fs.Args(), stdin, stdout, stderr)
	line, _ := json.Marshal(st)
	fmt.Fprintf(stderr, "\n%s%s\n", StatusPrefix, line)
	return st.ExitCode
}

// Run runs argv once for id in dir: see the package doc. The Status it returns is what Main prints last.
func Run(dir, id, operationID string, argv []string, stdin io.Reader, stdout, stderr io.Writer) Status {
	st := Status{ID: id, OperationID: operationID, State: Refused, ExitCode: ExitRefused}
	if why := badCall(dir, id, argv); why != "" {
		st.Detail = why
		return st
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		st.Detail = "the marker directory cannot be made: " + errText(err)
		return st
	}
	markerPath := filepath.Join(dir, id+".marker")
	resultPath := filepath.Join(dir, id+".result")
	st.Marker = markerPath
	host, _ := os.Hostname()
	sum := sha256.Sum256([]byte(strings.Join(argv, "\x00")))
	m := marker{ID: id, OperationID: operationID, Command: hex.EncodeToString(sum[:]), Host: host, PID: os.Getpid(),
		StartedAt: now()}
	f, err := os.OpenFile(markerPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return earlier(st, markerPath, resultPath, stdout)
	}
	if err != nil {
		st.Detail = "the marker cannot be created: " + errText(err)
		return st
	}
	if err := writeMarker(f, dir, m); err != nil {
		// The marker exists, so no later run does the work: the result says why this one did not.
		st.Detail = "the marker was created but not written: " + errText(err)
		_ = writeResult(dir, resultPath, result{ID: id, OperationID: operationID, ExitCode: ExitRefused, StartedAt: m.StartedAt,
			FinishedAt: now(), StdoutSHA256: hex.EncodeToString(sha256.New().Sum(nil))})
		return st
	}
	st.StartedAt = m.StartedAt

	out := &capture{w: stdout, h: sha256.New()}
	code := runCommand(argv, stdin, out, stderr)
	res := result{ID: id, OperationID: operationID, ExitCode: code, Stdout: out.buf.Bytes(), StdoutTruncated: out.truncated,
		StdoutSHA256: hex.EncodeToString(out.h.Sum(nil)), StartedAt: m.StartedAt, FinishedAt: now()}
	if err := writeResult(dir, resultPath, res); err != nil {
		st.Detail = "the command ran but its result could not be recorded: " + errText(err)
	}
	st.State, st.ExitCode, st.FinishedAt = Ran, code, res.FinishedAt
	return st
}

// badCall says why Run refuses its arguments before touching the host, or "" when it takes them.
func badCall(dir, id string, argv []string) string {
	switch {
	case !idRE.MatchString(id):
		return "the id is 1 to 128 letters, digits, _ and -"
	case dir == "" || !filepath.IsAbs(dir):
		return "--dir is an absolute path"
	case len(argv) == 0:
		return "no command after --"
	}
	return ""
}

// writeMarker writes m into the marker file f, just created, and makes it and its directory entry durable.
func writeMarker(f *os.File, dir string, m marker) error {
	raw, _ := json.Marshal(m)
	_, werr := f.Write(append(raw, '\n'))
	return errors.Join(werr, f.Sync(), f.Close(), syncDir(dir))
}

// runCommand runs argv and returns its exit code as a shell reports it: 128+9 when a signal killed it, 127 when it
// could not be started.
func runCommand(argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err := cmd.Run()
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode()
	case errors.As(err, &ee):
		return 128 + 9 // killed by a signal: what a shell reports
	default:
		fmt.Fprintf(stderr, "retrysafe marker: %s\n", errText(err))
		return 127 // could not be started
	}
}

// earlier reads what the run that created the marker recorded.
func earlier(st Status, markerPath, resultPath string, stdout io.Writer) Status {
	var m marker
	if raw, err := os.ReadFile(markerPath); err == nil {
		_ = json.Unmarshal(raw, &m)
	}
	st.StartedAt = m.StartedAt
	raw, err := os.ReadFile(resultPath)
	if errors.Is(err, fs.ErrNotExist) {
		st.State, st.ExitCode = InProgress, ExitInProgress
		st.Detail = fmt.Sprintf("a run (pid %d on %s) created the marker at %s and recorded no result: it is running or died "+
			"mid-way; not run again", m.PID, m.Host, m.StartedAt)
		return st
	}
	var r result
	if err == nil {
		err = json.Unmarshal(raw, &r)
	}
	if err != nil {
		st.Detail = "the recorded result cannot be read: " + errText(err)
		return st
	}
	_, _ = stdout.Write(r.Stdout)
	st.State, st.ExitCode, st.FinishedAt = Replayed, r.ExitCode, r.FinishedAt
	return st
}

// writeResult writes the result beside the marker: a temporary file, fsynced, renamed into place.
func writeResult(dir, path string, r result) error {
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".result-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(append(raw, '\n'))
	if err := errors.Join(werr, tmp.Sync(), tmp.Close()); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// capture passes standard output on, hashing all of it and keeping the first MaxOutputBytes.
type capture struct {
	w         io.Writer
	h         hash.Hash
	buf       bytes.Buffer
	truncated bool
}

func (c *capture) Write(p []byte) (int, error) {
	c.h.Write(p)
	room := MaxOutputBytes - c.buf.Len()
	c.buf.Write(p[:min(room, len(p))])
	c.truncated = c.truncated || len(p) > room
	return c.w.Write(p)
}

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// errText is an error's text without the paths the caller already knows.
func errText(err error) string {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// ParseStatus finds the status line in a run's standard error and returns it, and stderr without it.
func ParseStatus(stderr []byte) (Status, []byte, bool) {
	i := bytes.LastIndex(stderr, []byte("\n"+StatusPrefix))
	if i < 0 {
		return Status{}, stderr, false
	}
	line := stderr[i+1+len(StatusPrefix):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	var st Status
	if err := json.Unmarshal(line, &st); err != nil || st.State == "" {
		return Status{}, stderr, false
	}
	return st, stderr[:i], true
}
