package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// commandBundle is an agent whose tools are commands on the test SSH server (host "web"), with a working
// directory of its own.
type commandBundle struct {
	srv     *sshServer
	dir     string // the commands' working directory on the host
	journal string
	tools   *agent.Catalog
	env     map[string]string
}

// commandTools is a tools file with host web (the test server; marker set: its effects run under the marker)
// and the tools the tests use.
func commandTools(t *testing.T, srv *sshServer, workdir string, marker bool, hostKey string) *agent.Catalog {
	t.Helper()
	if hostKey == "" {
		hostKey = srv.hostKey
	}
	markerLines := ""
	if marker {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		markerLines = fmt.Sprintf("    marker_dir: %s\n    marker_helper: RETRYSAFE_TEST_MARKER=1 %s\n",
			filepath.Join(workdir, "markers"), self)
	}
	file := fmt.Sprintf(`hosts:
  web:
    address_env: WEB_ADDR
    user: deploy
    host_key: %s
    identity_file_env: WEB_KEY
%stools:
  - name: append_line
    kind: command
    summary: Append a line to the ledger.
    host: web
    family: effect
    workdir: %s
    command: printf '%%s\n' {{line}} >> ledger.txt
    input_schema: {type: object, required: [line], properties: {line: {type: string}}}
  - name: set_mode
    kind: command
    summary: Set the service mode.
    host: web
    family: converge
    workdir: %s
    command: echo run >> converge-runs.txt && printf '%%s\n' {{mode}} > mode.txt
    check: test "$(cat mode.txt 2>/dev/null)" = {{mode}}
    input_schema: {type: object, required: [mode], properties: {mode: {type: string}}}
  - name: disk_free
    kind: command
    summary: Read the free space.
    host: web
    family: read
    workdir: %s
    command: echo read >> read-runs.txt && echo free {{path}}
    input_schema: {type: object, required: [path], properties: {path: {type: string}}}
  - name: deploy_with_token
    kind: command
    summary: Deploy with the release token.
    host: web
    family: effect
    workdir: %s
    secrets: [DEPLOY_TOKEN]
    command: printf '%%s\n' "$DEPLOY_TOKEN" >> token-seen.txt && echo "deployed {{release}} with $DEPLOY_TOKEN" && echo "stderr $DEPLOY_TOKEN" >&2
    input_schema: {type: object, required: [release], properties: {release: {type: string}}}
`, hostKey, markerLines, workdir, workdir, workdir, workdir)
	c, err := agent.ParseTools([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func setupCommands(t *testing.T, lose func(n int) int, marker bool) *commandBundle {
	t.Helper()
	srv := startSSHServer(t, lose)
	dir := t.TempDir()
	return &commandBundle{srv: srv, dir: dir, journal: filepath.Join(t.TempDir(), "journal.jsonl"),
		tools: commandTools(t, srv, dir, marker, ""),
		env:   map[string]string{"WEB_ADDR": srv.addr, "WEB_KEY": srv.identity, "DEPLOY_TOKEN": "tok-s3cr3t-7781"}}
}

func (b *commandBundle) open(t *testing.T) *agent.Agent {
	t.Helper()
	a, err := agent.Open(b.journal, agent.Config{Tools: b.tools, Getenv: func(k string) string { return b.env[k] },
		Budget: 4, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond, AttemptTimeout: 20 * time.Second,
		// The test's SSH server forks in this process: a child between fork and exec holds the journal's lock
		// for a moment after the agent before this one let go.
		LockWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// lines counts the lines of a file in the working directory: how many times a command's effect happened.
func (b *commandBundle) lines(t *testing.T, name string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(b.dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(raw, []byte("\n"))
}

func (b *commandBundle) records(t *testing.T, typ string) []map[string]any {
	t.Helper()
	recs, err := agent.ReadRecords(b.journal)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, r := range recs {
		var m map[string]any
		if err := json.Unmarshal(r, &m); err != nil {
			t.Fatal(err)
		}
		if m["type"] == typ {
			out = append(out, m)
		}
	}
	return out
}

// boundaries are the journaled attempts' execution boundaries, in order.
func (b *commandBundle) boundaries(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, r := range b.records(t, agent.RecAttemptFinished) {
		cmd, _ := r["command"].(map[string]any)
		s, _ := cmd["boundary"].(string)
		out = append(out, s)
	}
	return out
}

func first(n int) func(int) int {
	return func(i int) int {
		if i == 1 {
			return n
		}
		return keep
	}
}

// An effect command whose connection is lost after it ran is not run again: without a marker on the host the
// operation goes to a person, and calling again, or resume, runs nothing.
func TestCommandEffectLostConnectionIsNeverRunTwice(t *testing.T) {
	b := setupCommands(t, first(cutAfterRun), false)
	a := b.open(t)
	res, err := a.Do(t.Context(), "ledger-1", "append_line", json.RawMessage(`{"line":"paid 10"}`), agent.DoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != agent.StateNeedsHuman || res.Code != agent.CodeCommandUnknown {
		t.Fatalf("result %s %s, want needs_human %s: %+v", res.State, res.Code, agent.CodeCommandUnknown, res)
	}
	for range 2 {
		if _, err := a.Do(t.Context(), "ledger-1", "append_line", json.RawMessage(`{"line":"paid 10"}`), agent.DoOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Resume(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.lines(t, "ledger.txt"); n != 1 {
		t.Fatalf("the ledger has %d lines, want 1: the effect ran again", n)
	}
	if n := b.srv.execs.Load(); n != 1 {
		t.Fatalf("the host got %d exec requests, want 1", n)
	}
	if got := b.boundaries(t); len(got) != 1 || got[0] != agent.BoundaryStarted {
		t.Fatalf("boundaries %v, want [started]: a lost connection is not failed", got)
	}
	started := b.records(t, agent.RecAttemptStarted)[0]["command"].(map[string]any)
	if started["host_key"] != b.srv.hostKey || started["address"] != b.srv.addr {
		t.Fatalf("attempt_started command %v, want host key %s at %s", started, b.srv.hostKey, b.srv.addr)
	}
	op := b.records(t, agent.RecOperationCreated)[0]["command"].(map[string]any)
	if op["host"] != "web" || op["account"] != "deploy" || op["workdir"] != b.dir || op["family"] != "effect" ||
		op["display"] != `printf '%s\n' 'paid 10' >> ledger.txt` {
		t.Fatalf("operation_created command %v", op)
	}
	// A person looks at the host and has it run again: that runs it.
	res, err = a.Retry(t.Context(), "ledger-1", agent.RetryRequest{By: "os:alice", Reason: "checked the ledger: not there"})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("retry: %v %+v", err, res)
	}
	if n := b.lines(t, "ledger.txt"); n != 2 {
		t.Fatalf("the ledger has %d lines after a person's retry, want 2", n)
	}
}

// With a marker on the host, the retry of an effect whose connection was lost reaches the marker, which returns
// the result the first run recorded: the effect happened once, and the journal links the operation to the marker.
func TestCommandEffectMarkerAnswersTheRetry(t *testing.T) {
	b := setupCommands(t, first(cutAfterRun), true)
	a := b.open(t)
	res, err := a.Do(t.Context(), "ledger-2", "append_line", json.RawMessage(`{"line":"paid 20"}`), agent.DoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != agent.StateSucceeded || !strings.Contains(string(res.Body), `"replayed":true`) {
		t.Fatalf("result %+v, want succeeded from the marker's recorded result", res)
	}
	if n := b.lines(t, "ledger.txt"); n != 1 {
		t.Fatalf("the ledger has %d lines, want 1", n)
	}
	if n := b.srv.execs.Load(); n != 2 {
		t.Fatalf("the host got %d exec requests, want 2 (the lost one, the marker's answer)", n)
	}
	if got := b.boundaries(t); strings.Join(got, ",") != "started,exit_received" {
		t.Fatalf("boundaries %v", got)
	}
	op, _ := a.Operation("ledger-2")
	marker := filepath.Join(b.dir, "markers", op.IdempotencyKey+".marker")
	raw, err := os.ReadFile(marker)
	if err != nil || !strings.Contains(string(raw), op.OperationID) {
		t.Fatalf("marker %s: %v %s, want it to name operation %s", marker, err, raw, op.OperationID)
	}
	fin := b.records(t, agent.RecAttemptFinished)[1]["command"].(map[string]any)["marker"].(map[string]any)
	if fin["state"] != "replayed" || fin["path"] != marker {
		t.Fatalf("attempt 2's marker %v, want replayed at %s", fin, marker)
	}
	var timeline bytes.Buffer
	op.WriteTimeline(&timeline)
	for _, want := range []string{"marker      web:" + marker, "boundary started", "marker replayed " + marker, "key " + b.srv.hostKey} {
		if !strings.Contains(timeline.String(), want) {
			t.Errorf("timeline lacks %q:\n%s", want, timeline.String())
		}
	}
	// Another agent given the same action (its own journal, the same namespace) reaches the same marker.
	other := &commandBundle{srv: b.srv, dir: b.dir, journal: filepath.Join(t.TempDir(), "j2"), tools: b.tools, env: b.env}
	res, err = other.open(t).Do(t.Context(), "ledger-2", "append_line", json.RawMessage(`{"line":"paid 20"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("second journal: %v %+v", err, res)
	}
	if n := b.lines(t, "ledger.txt"); n != 1 {
		t.Fatalf("the ledger has %d lines after a second agent, want 1", n)
	}
}

// A converge command whose end was lost runs its check first: a state reached is not set again, a state not
// reached is.
func TestCommandConvergeRunsAgainOnlyAfterItsCheck(t *testing.T) {
	t.Run("reached", func(t *testing.T) {
		b := setupCommands(t, first(cutAfterRun), false)
		res, err := b.open(t).Do(t.Context(), "mode-1", "set_mode", json.RawMessage(`{"mode":"maintenance"}`), agent.DoOptions{})
		if err != nil || res.State != agent.StateSucceeded {
			t.Fatalf("%v %+v", err, res)
		}
		if n := b.lines(t, "converge-runs.txt"); n != 1 {
			t.Fatalf("the command ran %d times, want 1: the check said the state was reached", n)
		}
		checks := b.records(t, agent.RecObservation)
		if len(checks) != 1 || checks[0]["kind"] != agent.ObsCommandCheck {
			t.Fatalf("observations %v, want one command_check", checks)
		}
	})
	t.Run("not reached", func(t *testing.T) {
		b := setupCommands(t, first(cutBeforeRun), false)
		res, err := b.open(t).Do(t.Context(), "mode-2", "set_mode", json.RawMessage(`{"mode":"maintenance"}`), agent.DoOptions{})
		if err != nil || res.State != agent.StateSucceeded {
			t.Fatalf("%v %+v", err, res)
		}
		if n := b.lines(t, "converge-runs.txt"); n != 1 {
			t.Fatalf("the command ran %d times, want 1", n)
		}
		if n := b.srv.execs.Load(); n != 3 {
			t.Fatalf("%d exec requests, want 3: the lost one, the check, the run", n)
		}
		b.srv.mu.Lock()
		check := b.srv.commands[1]
		b.srv.mu.Unlock()
		if !strings.Contains(check, `test "$(cat mode.txt 2>/dev/null)" = 'maintenance'`) {
			t.Fatalf("second exec %q, want the check", check)
		}
	})
}

// A read command whose end was lost runs again.
func TestCommandReadRunsAgain(t *testing.T) {
	b := setupCommands(t, first(cutAfterRun), false)
	res, err := b.open(t).Do(t.Context(), "df-1", "disk_free", json.RawMessage(`{"path":"/srv"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("%v %+v", err, res)
	}
	if n := b.lines(t, "read-runs.txt"); n != 2 {
		t.Fatalf("the read ran %d times, want 2", n)
	}
	if !strings.Contains(string(res.Body), `"stdout":"free /srv\n"`) {
		t.Fatalf("body %s", res.Body)
	}
}

// A secret reaches the host, on the command's standard input, and nowhere else: not the journal, the timeline,
// the result, the command line the host saw, or the fingerprint (another value, same intent).
func TestCommandSecretsNeverReachTheJournal(t *testing.T) {
	b := setupCommands(t, first(cutAfterRun), true)
	secret := b.env["DEPLOY_TOKEN"]
	a := b.open(t)
	res, err := a.Do(t.Context(), "deploy-1", "deploy_with_token", json.RawMessage(`{"release":"v42"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("%v %+v", err, res)
	}
	if n := b.lines(t, "token-seen.txt"); n != 1 {
		t.Fatalf("the host saw the token %d times, want 1", n)
	}
	seen, _ := os.ReadFile(filepath.Join(b.dir, "token-seen.txt"))
	if string(seen) != secret+"\n" {
		t.Fatalf("the host saw %q, want the secret", seen)
	}
	op, _ := a.Operation("deploy-1")
	var shown bytes.Buffer
	op.WriteTimeline(&shown)
	resJSON, _ := json.Marshal(res)
	journal, _ := os.ReadFile(b.journal)
	b.srv.mu.Lock()
	commands := strings.Join(b.srv.commands, "\n")
	b.srv.mu.Unlock()
	for name, text := range map[string]string{"journal": string(journal), "timeline": shown.String(), "result": string(resJSON),
		"exec requests": commands} {
		if strings.Contains(text, secret) {
			t.Errorf("the secret reached the %s:\n%s", name, text)
		}
	}
	if !strings.Contains(string(res.Body), "with [secret DEPLOY_TOKEN]") || !strings.Contains(op.Command.Display, `"$DEPLOY_TOKEN"`) {
		t.Errorf("body %s, display %s: want the secret redacted and referenced", res.Body, op.Command.Display)
	}
	// Another value of the secret is the same intent: the fingerprint holds the reference, not the value.
	b.env["DEPLOY_TOKEN"] = "another-value"
	if _, err := a.Do(t.Context(), "deploy-1", "deploy_with_token", json.RawMessage(`{"release":"v42"}`), agent.DoOptions{}); err != nil {
		t.Fatalf("same intent with another secret value: %v", err)
	}
}

// A host presenting another key than the pinned one is never sent the command: every attempt is not_started,
// and the budget ends with a person.
func TestCommandHostKeyMismatchSendsNothing(t *testing.T) {
	b := setupCommands(t, nil, false)
	b.tools = commandTools(t, b.srv, b.dir, false, "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	res, err := b.open(t).Do(t.Context(), "ledger-3", "append_line", json.RawMessage(`{"line":"x"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateNeedsHuman {
		t.Fatalf("%v %+v", err, res)
	}
	if n := b.srv.execs.Load(); n != 0 {
		t.Fatalf("%d exec requests reached a host with the wrong key", n)
	}
	for i, r := range b.records(t, agent.RecAttemptFinished) {
		if r["error"] != "host_key_mismatch" || r["command"].(map[string]any)["boundary"] != agent.BoundaryNotStarted {
			t.Fatalf("attempt %d: %v", i+1, r)
		}
	}
	if n := len(b.records(t, agent.RecAttemptFinished)); n != 4 {
		t.Fatalf("%d attempts, want the budget's 4", n)
	}
}

// audit verify --journal (VerifyJournal) checks command records like any: intact as written, broken when an
// exit code is changed.
func TestVerifyJournalCoversCommandRecords(t *testing.T) {
	b := setupCommands(t, nil, false)
	a := b.open(t)
	if res, err := a.Do(t.Context(), "ledger-4", "append_line", json.RawMessage(`{"line":"y"}`), agent.DoOptions{}); err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("%v %+v", err, res)
	}
	a.Close()
	if rep, err := agent.VerifyJournal(b.journal); err != nil || !rep.Intact() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	raw, _ := os.ReadFile(b.journal)
	forged := bytes.Replace(raw, []byte(`"boundary":"exit_received","exit_code":0`), []byte(`"boundary":"exit_received","exit_code":1`), 1)
	if bytes.Equal(forged, raw) {
		t.Fatal("no exit code in the journal to change")
	}
	if err := os.WriteFile(b.journal, forged, 0o600); err != nil {
		t.Fatal(err)
	}
	if rep, err := agent.VerifyJournal(b.journal); err != nil || rep.Intact() {
		t.Fatalf("verify after changing an exit code: %v %+v", err, rep)
	}
}

// A local host runs commands with sh on this machine.
func TestCommandOnLocalHost(t *testing.T) {
	dir := t.TempDir()
	c, err := agent.ParseTools(fmt.Appendf(nil, `hosts: {here: {local: true}}
tools:
  - {name: touch_flag, kind: command, summary: Touch., host: here, family: effect, workdir: %s,
     command: "echo {{what}} >> flags.txt", input_schema: {type: object, required: [what], properties: {what: {type: string}}}}
`, dir))
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.Open(filepath.Join(t.TempDir(), "j"), agent.Config{Tools: c})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	res, err := a.Do(t.Context(), "f1", "touch_flag", json.RawMessage(`{"what":"a b; rm -rf /"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("%v %+v", err, res)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "flags.txt"))
	if string(raw) != "a b; rm -rf /\n" {
		t.Fatalf("flags.txt %q: the argument must arrive as one quoted word", raw)
	}
}

// A tools file declares command tools only in ways the rule can follow.
func TestCommandToolsFileRefusals(t *testing.T) {
	host := "hosts: {web: {address: '127.0.0.1:22', user: u, host_key: 'SHA256:x', identity_file: /k}}\n"
	for name, file := range map[string]string{
		"no host key":       "hosts: {web: {address: 'a:22', user: u, identity_file: /k}}\ntools: [{name: t, kind: command, summary: s, host: web, family: read, command: ls, input_schema: {type: object}}]",
		"unknown family":    host + "tools: [{name: t, kind: command, summary: s, host: web, family: write, command: ls, input_schema: {type: object}}]",
		"converge no check": host + "tools: [{name: t, kind: command, summary: s, host: web, family: converge, command: ls, input_schema: {type: object}}]",
		"check on effect":   host + "tools: [{name: t, kind: command, summary: s, host: web, family: effect, command: ls, check: ls, input_schema: {type: object}}]",
		"unknown host":      host + "tools: [{name: t, kind: command, summary: s, host: db, family: read, command: ls, input_schema: {type: object}}]",
		"secret name":       host + "tools: [{name: t, kind: command, summary: s, host: web, family: read, command: ls, secrets: ['a b'], input_schema: {type: object}}]",
		"optional arg":      host + "tools: [{name: t, kind: command, summary: s, host: web, family: read, command: 'ls {{p}}', input_schema: {type: object, properties: {p: {type: string}}}}]",
		"retry mode":        host + "tools: [{name: t, kind: command, summary: s, host: web, family: read, retry_mode: create, command: ls, input_schema: {type: object}}]",
		"request with host": "services: {s: {base_url: 'http://x'}}\ntools: [{name: t, summary: s, service: s, method: POST, path: /v1/x, retry_mode: create, host: web, input_schema: {type: object}}]",
	} {
		if _, err := agent.ParseTools([]byte(file)); !errors.Is(err, agent.ErrToolsFile) {
			t.Errorf("%s: %v, want ErrToolsFile", name, err)
		}
	}
}

// An agent that stops after the command was sent, before it journaled the end, leaves an attempt without its
// end: resume takes the command as started, and an effect goes to a person instead of running again.
func TestCommandAgentStoppedAfterSendIsStarted(t *testing.T) {
	b := setupCommands(t, nil, false)
	a, err := agent.Open(b.journal, agent.Config{Tools: b.tools, Getenv: func(k string) string { return b.env[k] },
		Hook: func(point string) {
			if point == "after_send" {
				panic("stopped after send")
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the agent did not stop at after_send")
			}
		}()
		_, _ = a.Do(t.Context(), "ledger-5", "append_line", json.RawMessage(`{"line":"z"}`), agent.DoOptions{})
	}()
	a.Close()
	if n := len(b.records(t, agent.RecAttemptFinished)); n != 0 {
		t.Fatalf("%d attempt_finished records, want none", n)
	}
	results, err := b.open(t).Resume(t.Context())
	if err != nil || len(results) != 1 || results[0].State != agent.StateNeedsHuman || results[0].Code != agent.CodeCommandUnknown {
		t.Fatalf("resume: %v %+v", err, results)
	}
	if n := b.srv.execs.Load(); n != 1 {
		t.Fatalf("the host got %d exec requests, want 1", n)
	}
	obs := b.records(t, agent.RecObservation)
	if len(obs) != 1 || obs[0]["kind"] != agent.ObsInterrupted {
		t.Fatalf("observations %v, want attempt_interrupted", obs)
	}
}

// An effect whose connection was lost after the host accepted it and before it ran: the retry reaches the
// marker, which has no record of it, so it runs, once.
func TestCommandEffectMarkerRunsWhatNeverRan(t *testing.T) {
	b := setupCommands(t, first(cutBeforeRun), true)
	res, err := b.open(t).Do(t.Context(), "ledger-6", "append_line", json.RawMessage(`{"line":"paid 60"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded || strings.Contains(string(res.Body), `"replayed":true`) {
		t.Fatalf("%v %+v, want succeeded by a run the marker let through", err, res)
	}
	if n := b.lines(t, "ledger.txt"); n != 1 {
		t.Fatalf("the ledger has %d lines, want 1", n)
	}
	fin := b.records(t, agent.RecAttemptFinished)
	if m := fin[len(fin)-1]["command"].(map[string]any)["marker"].(map[string]any); m["state"] != "ran" {
		t.Fatalf("marker %v, want ran", m)
	}
}

// A host checked against a known_hosts file: its key there is accepted and journaled; another host's entry
// under its address is not, and nothing is sent.
func TestCommandKnownHosts(t *testing.T) {
	b := setupCommands(t, nil, false)
	other := startSSHServer(t, nil)
	for _, tc := range []struct {
		name  string
		entry *sshServer
		want  string
	}{{"its key", b.srv, agent.StateSucceeded}, {"another key", other, agent.StateNeedsHuman}} {
		t.Run(tc.name, func(t *testing.T) {
			known := filepath.Join(t.TempDir(), "known_hosts")
			if err := os.WriteFile(known, []byte(knownHostsLine(t, b.srv.addr, tc.entry)+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := agent.ParseTools(fmt.Appendf(nil, `hosts: {web: {address: %q, user: deploy, known_hosts: %s, identity_file: %s}}
tools:
  - {name: df, kind: command, summary: Read., host: web, family: read, command: "echo ok", input_schema: {type: object}}
`, b.srv.addr, known, b.srv.identity))
			if err != nil {
				t.Fatal(err)
			}
			journal := filepath.Join(t.TempDir(), "j")
			a, err := agent.Open(journal, agent.Config{Tools: c, Budget: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			execs := b.srv.execs.Load()
			res, err := a.Do(t.Context(), "df-1", "df", nil, agent.DoOptions{})
			if err != nil || res.State != tc.want {
				t.Fatalf("%v %+v, want %s", err, res, tc.want)
			}
			raw, _ := os.ReadFile(journal)
			hasKey := strings.Contains(string(raw), `"host_key":"`+b.srv.hostKey+`"`)
			if sent := b.srv.execs.Load() - execs; hasKey != (tc.want == agent.StateSucceeded) || sent != map[bool]int32{true: 1, false: 0}[hasKey] {
				t.Fatalf("host key journaled %v, %d exec requests sent", hasKey, sent)
			}
		})
	}
}
