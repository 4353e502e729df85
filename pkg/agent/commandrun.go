package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/retrysafe/retrysafe/pkg/agent/opmarker"
	"github.com/retrysafe/retrysafe/pkg/ids"
)

// maxCommandOutput bounds the standard output and error a command attempt journals (each, after secrets are
// redacted); its SHA-256 covers the whole of standard output.
const maxCommandOutput = 64 << 10

// commandReady refuses, before anything is journaled, a command tool the agent could not run: a host the tools
// file lost, or a secret that is not set or cannot travel on a line of standard input.
func (a *Agent) commandReady(tool Tool) error {
	if _, ok := a.cfg.Tools.host(tool.Command.Host); !ok {
		return fmt.Errorf("%w: host %q is not in the tools file; nothing was run", ErrBadArguments, tool.Command.Host)
	}
	_, _, err := a.secretValues(tool.Command.Secrets)
	return err
}

// secretValues reads the secrets named: the lines the command's standard input carries, and the values to redact.
func (a *Agent) secretValues(names []string) (stdin []byte, values map[string]string, err error) {
	values = map[string]string{}
	for _, name := range names {
		name = strings.TrimPrefix(name, "env:")
		v := a.cfg.Getenv(name)
		if v == "" {
			return nil, nil, fmt.Errorf("%w: secret %s is not set in the environment; nothing was run", ErrBadArguments, name)
		}
		if strings.ContainsAny(v, "\n\x00") {
			return nil, nil, fmt.Errorf("%w: secret %s holds a line break or NUL, which its line of standard input cannot carry; nothing was run",
				ErrBadArguments, name)
		}
		values[name] = v
		stdin = append(append(stdin, v...), '\n')
	}
	return stdin, values, nil
}

// commandOperation fills a command operation's record from its tool.
func (a *Agent) commandOperation(op *Operation, tool Tool, req request) {
	h, _ := a.cfg.Tools.host(tool.Command.Host)
	account := tool.Command.Account
	if h.Local {
		account = "local:" + localUser()
	}
	op.Method, op.RouteTemplate, op.Path = "COMMAND", "host "+tool.Command.Host, ""
	op.Command = tool.Command.intent(req, h, op.IdempotencyKey, account)
	// The authority is what the agent logs in with: the identity file's reference, never the key.
	switch {
	case h.Local:
		op.AuthorityRef = account
	case h.IdentityFileEnv != "":
		op.AuthorityRef = "env:" + h.IdentityFileEnv + " (identity file)"
	default:
		op.AuthorityRef = "file:" + h.IdentityFile
	}
}

func localUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return fmt.Sprint(os.Getuid())
}

// wire is the shell text an attempt sends: it reads the secrets from standard input into the environment, enters
// the working directory, and runs the command, under the host's marker helper for a marked effect.
func wire(ci *CommandIntent, command string, h *HostDef, operationID string, marked bool) string {
	var b strings.Builder
	for _, ref := range ci.Secrets {
		name := strings.TrimPrefix(ref, "env:")
		fmt.Fprintf(&b, "IFS= read -r %s || exit 97; export %s; ", name, name)
	}
	if ci.Workdir != "" {
		fmt.Fprintf(&b, "cd %s || exit 96; ", shQuote(ci.Workdir))
	}
	if marked && ci.Marker != nil {
		helper := h.MarkerHelper
		if helper == "" {
			helper = "retrysafe marker"
		}
		fmt.Fprintf(&b, "%s --dir %s --id %s --operation %s -- sh -c %s", helper, shQuote(ci.Marker.Dir), shQuote(ci.Marker.ID),
			shQuote(operationID), shQuote(command))
		return b.String()
	}
	b.WriteString(command)
	return b.String()
}

// commandRun is what one run of a command on a host reported.
type commandRun struct {
	boundary       string
	exit           *int
	stdout, stderr *capture
	err            string // from a fixed list: error text never goes to the journal
}

// hostConn is one connection to a host, for one run.
type hostConn interface {
	run(ctx context.Context, wire string, stdin []byte, started func()) commandRun
	close()
}

// connect opens a connection to op's host: for SSH, dialled, its host key checked and logged into. The
// CommandAttempt says where, with the key's fingerprint; an error is from a fixed list.
func (a *Agent) connect(ctx context.Context, op *Operation) (hostConn, *CommandAttempt, error) {
	h, ok := a.cfg.Tools.host(op.Command.Host)
	if !ok {
		return nil, &CommandAttempt{}, errors.New("host_not_in_tools_file")
	}
	if h.Local {
		return localConn{}, &CommandAttempt{Address: "local"}, nil
	}
	addr := a.fromEnv(h.AddressEnv, h.Address)
	info := &CommandAttempt{Address: addr}
	signer, err := a.identity(h)
	if err != nil {
		return nil, info, err
	}
	check, err := hostKeyCheck(h, info)
	if err != nil {
		return nil, info, err
	}
	conn, err := a.dialSSH(ctx, addr, &ssh.ClientConfig{User: h.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: check, Timeout: a.cfg.AttemptTimeout})
	if err != nil {
		if errors.Is(err, errHostKeyMismatch) {
			info.HostKey = ""
		}
		return nil, info, err
	}
	return conn, info, nil
}

// errHostKeyMismatch: the host presented a key that is neither the pinned one nor in the known_hosts file.
var errHostKeyMismatch = errors.New("host_key_mismatch")

// fromEnv is the environment variable env as Config.Getenv reads it, or def when it is unset or empty.
func (a *Agent) fromEnv(env, def string) string {
	if env != "" && a.cfg.Getenv(env) != "" {
		return a.cfg.Getenv(env)
	}
	return def
}

// identity reads the host's private key, from identity_file_env or identity_file.
func (a *Agent) identity(h *HostDef) (ssh.Signer, error) {
	pem, err := os.ReadFile(a.fromEnv(h.IdentityFileEnv, h.IdentityFile))
	if err != nil {
		return nil, errors.New("identity_unreadable")
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		return nil, errors.New("identity_unreadable")
	}
	return signer, nil
}

// hostKeyCheck accepts the host's key by its pinned fingerprint or its known_hosts file, and records the
// fingerprint of the key it accepted in info.
func hostKeyCheck(h *HostDef, info *CommandAttempt) (ssh.HostKeyCallback, error) {
	var known ssh.HostKeyCallback
	if h.KnownHosts != "" {
		var err error
		if known, err = knownhosts.New(h.KnownHosts); err != nil {
			return nil, errors.New("known_hosts_unreadable")
		}
	}
	return func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		fp := ssh.FingerprintSHA256(key)
		if h.HostKey != "" {
			if subtle.ConstantTimeCompare([]byte(fp), []byte(h.HostKey)) != 1 {
				return errHostKeyMismatch
			}
		} else if err := known(hostname, remote, key); err != nil {
			return errHostKeyMismatch
		}
		info.HostKey = fp
		return nil
	}, nil
}

// dialSSH dials addr and logs in within the attempt timeout; an error says, from a fixed list, which step failed.
func (a *Agent) dialSSH(ctx context.Context, addr string, cfg *ssh.ClientConfig) (hostConn, error) {
	d := net.Dialer{Timeout: a.cfg.AttemptTimeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, errors.New(dialError(err))
	}
	_ = nc.SetDeadline(time.Now().Add(a.cfg.AttemptTimeout))
	cc, chans, reqs, err := ssh.NewClientConn(nc, addr, cfg)
	if err != nil {
		nc.Close()
		switch {
		case errors.Is(err, errHostKeyMismatch):
			return nil, errHostKeyMismatch
		case strings.Contains(err.Error(), "unable to authenticate"):
			return nil, errors.New("login_refused")
		}
		return nil, errors.New("handshake_failed")
	}
	_ = nc.SetDeadline(time.Time{})
	return sshConn{c: ssh.NewClient(cc, chans, reqs)}, nil
}

func dialError(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	}
	return "dial_failed"
}

type sshConn struct{ c *ssh.Client }

func (s sshConn) close() { s.c.Close() }

// run sends the command on a new session. The host accepting the exec request is the boundary "started"; its
// exit status, "exit_received". A connection lost in between leaves it "started": the command may have run.
func (s sshConn) run(ctx context.Context, wire string, stdin []byte, started func()) commandRun {
	r := commandRun{boundary: BoundaryNotStarted, stdout: newCapture(), stderr: newCapture()}
	sess, err := s.c.NewSession()
	if err != nil {
		r.err = "session_refused"
		return r
	}
	defer sess.Close()
	sess.Stdin, sess.Stdout, sess.Stderr = bytes.NewReader(stdin), r.stdout, r.stderr
	if err := sess.Start(wire); err != nil {
		// "ssh: command ... failed" is the host's no to the exec request; anything else is the connection lost
		// while the request was out, which the host may have acted on.
		if strings.HasPrefix(err.Error(), "ssh: command ") && strings.HasSuffix(err.Error(), " failed") {
			r.err = "exec_refused"
			return r
		}
		r.boundary, r.err = BoundaryStarted, "connection_lost"
		return r
	}
	r.boundary = BoundaryStarted
	started()
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		s.c.Close()
		<-done
		r.err = "timeout"
		return r
	}
	var exit *ssh.ExitError
	switch {
	case err == nil:
		r.setExit(0)
	case errors.As(err, &exit) && exit.Signal() == "":
		r.setExit(exit.ExitStatus())
	case errors.As(err, &exit):
		r.err = "killed_by_signal"
	default:
		r.err = "connection_lost"
	}
	return r
}

func (r *commandRun) setExit(code int) { r.boundary, r.exit = BoundaryExitReceived, &code }

type localConn struct{}

func (localConn) close() {}

func (localConn) run(ctx context.Context, wire string, stdin []byte, started func()) commandRun {
	r := commandRun{boundary: BoundaryNotStarted, stdout: newCapture(), stderr: newCapture()}
	cmd := exec.CommandContext(ctx, "sh", "-c", wire)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), r.stdout, r.stderr
	if err := cmd.Start(); err != nil {
		r.err = "exec_failed"
		return r
	}
	r.boundary = BoundaryStarted
	started()
	err := cmd.Wait()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		r.err = "timeout"
	case err == nil:
		r.setExit(0)
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		r.setExit(ee.ExitCode())
	default:
		r.err = "killed_by_signal"
	}
	return r
}

// capture keeps the first maxCommandOutput bytes of a stream and hashes all of it.
type capture struct {
	buf       bytes.Buffer
	h         hash.Hash
	truncated bool
}

func newCapture() *capture { return &capture{h: sha256.New()} }

func (c *capture) Write(p []byte) (int, error) {
	c.h.Write(p)
	room := maxCommandOutput - c.buf.Len()
	c.buf.Write(p[:min(room, len(p))])
	c.truncated = c.truncated || len(p) > room
	return len(p), nil
}

// redact replaces every secret's value in s with [secret NAME].
func redact(s string, values map[string]string) string {
	for name, v := range values {
		s = strings.ReplaceAll(s, v, "[secret "+name+"]")
	}
	return s
}

// commandBody is what a command attempt's result carries (Result.Body): its exit code and output, secrets
// redacted, the marker helper's status line taken out of standard error.
type commandBody struct {
	ExitCode        *int   `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	Replayed        bool   `json:"replayed,omitempty"`
}

// sendCommand makes one attempt of a command operation: it connects and checks the host key, journals
// attempt_started with the key's fingerprint before the command is sent, and attempt_finished with the boundary
// it reached.
func (a *Agent) sendCommand(ctx context.Context, op *Operation, s step) error {
	h, ok := a.cfg.Tools.host(op.Command.Host)
	if !ok {
		return fmt.Errorf("%w: host %q of operation %s is not in the tools file; nothing was run", ErrBadArguments, op.Command.Host, op.OperationID)
	}
	stdin, secrets, err := a.secretValues(op.Command.Secrets)
	if err != nil {
		return err
	}
	at := &Attempt{Type: RecAttemptStarted, OperationID: op.OperationID, AttemptID: ids.New("att_"), Number: len(op.Attempts) + 1,
		Decision: s.decision, BudgetLeft: op.budgetLeft() - 1, RunID: a.runID, Process: a.process(op)}
	if prev := lastAttempt(op); prev != nil {
		at.RetryOf, at.RetryReason = prev.AttemptID, s.reason
		if at.RetryReason == "" {
			at.RetryReason = ReasonResponseLostAfterDispatch
		}
		if retryRequestedSince(op, prev) {
			at.RetryReason = ReasonOperatorRequested
		}
	}
	actx, cancel := context.WithTimeout(ctx, a.cfg.AttemptTimeout)
	defer cancel()
	start := time.Now()
	conn, info, cerr := a.connect(actx, op)
	at.Command, at.At = info, a.now()
	if err := a.record(at); err != nil {
		if conn != nil {
			conn.close()
		}
		return err
	}
	if cerr != nil {
		return a.finish(op, at, &AttemptResult{DispatchState: NotSent, Error: cerr.Error(),
			Command: &CommandResult{Boundary: BoundaryNotStarted}}, start)
	}
	defer conn.close()
	a.cfg.Hook("before_send")
	r := conn.run(actx, wire(op.Command, op.Command.Display, h, op.OperationID, true), stdin, func() { a.cfg.Hook("after_send") })
	return a.finish(op, at, commandResult(r, secrets, op.Command.Marker != nil), start)
}

// commandResult is the attempt_finished record of a run.
func commandResult(r commandRun, secrets map[string]string, marked bool) *AttemptResult {
	cr := &CommandResult{Boundary: r.boundary, ExitCode: r.exit, StdoutSHA256: hex.EncodeToString(r.stdout.h.Sum(nil))}
	res := &AttemptResult{Error: r.err, Command: cr}
	stderr := r.stderr.buf.Bytes()
	if marked {
		if st, rest, ok := opmarker.ParseStatus(stderr); ok {
			cr.Marker = &MarkerSeen{State: st.State, Path: st.Marker, StartedAt: st.StartedAt, FinishedAt: st.FinishedAt,
				Detail: redact(st.Detail, secrets)}
			stderr = rest
		}
	}
	switch r.boundary {
	case BoundaryNotStarted:
		res.DispatchState = NotSent
		return res
	case BoundaryStarted:
		res.DispatchState = SentNoResponse
	default:
		res.DispatchState = ResponseReceived
		switch {
		case cr.Marker != nil && cr.Marker.State == opmarker.InProgress:
			res.Code = CodeMarkerInProgress
		case cr.Marker != nil && cr.Marker.State == opmarker.Refused:
			res.Code = "marker_refused"
		case *r.exit != 0:
			res.Code = "exit_nonzero"
		}
	}
	body := commandBody{ExitCode: r.exit, Stdout: redact(r.stdout.buf.String(), secrets),
		Stderr: redact(string(bytes.TrimRight(stderr, "\n")), secrets), StdoutTruncated: r.stdout.truncated,
		Replayed: cr.Marker != nil && cr.Marker.State == opmarker.Replayed}
	res.Body, _ = json.Marshal(body)
	return res
}

// checkCommand runs a converge operation's check and journals what it said: a command_check observation.
func (a *Agent) checkCommand(ctx context.Context, op *Operation) error {
	h, ok := a.cfg.Tools.host(op.Command.Host)
	if !ok {
		return fmt.Errorf("%w: host %q of operation %s is not in the tools file; nothing was run", ErrBadArguments, op.Command.Host, op.OperationID)
	}
	stdin, _, err := a.secretValues(op.Command.Secrets)
	if err != nil {
		return err
	}
	ob := Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsCommandCheck, Endpoint: "check on " + op.Command.Host,
		RunID: a.runID}
	actx, cancel := context.WithTimeout(ctx, a.cfg.AttemptTimeout)
	defer cancel()
	start := time.Now()
	conn, _, cerr := a.connect(actx, op)
	r := commandRun{boundary: BoundaryNotStarted, stdout: newCapture(), stderr: newCapture()}
	if cerr == nil {
		r = conn.run(actx, wire(op.Command, op.Command.Check, h, op.OperationID, false), stdin, func() {})
		conn.close()
	}
	ob.Command = &CommandResult{Boundary: r.boundary, ExitCode: r.exit}
	switch {
	case cerr != nil:
		ob.Detail = "check not run: " + cerr.Error()
	case r.exit == nil:
		ob.Detail = "check gave no answer: " + r.err
	case *r.exit == 0:
		ob.Detail = "the check says the state is reached"
	case *r.exit == 1:
		ob.Detail = "the check says the state is not reached yet"
	default:
		ob.Detail = fmt.Sprintf("the check exited %d: neither reached (0) nor not reached (1)", *r.exit)
	}
	ob.DurationMS, ob.At = time.Since(start).Milliseconds(), a.now()
	return a.record(ob)
}

// writeIntent prints a command operation's intent lines in its timeline.
func (ci *CommandIntent) writeIntent(w io.Writer, op *Operation) {
	if ci == nil {
		return
	}
	printSafe(w, "  intent      %s on host %s, family %s, budget %d\n", op.Tool, ci.Host, string(ci.Family), op.Budget)
	printSafe(w, "  command     %s\n", ci.Display)
	printSafe(w, "  host        %s  account %s  workdir %s\n", ci.Host, cmpOr(ci.Account, "-"), cmpOr(ci.Workdir, "-"))
	if ci.Check != "" {
		printSafe(w, "  check       %s\n", ci.Check)
	}
	if len(ci.Secrets) > 0 {
		printSafe(w, "  secrets     %s (referenced; values never journaled)\n", strings.Join(ci.Secrets, ", "))
	}
	if ci.Marker != nil {
		printSafe(w, "  marker      %s:%s (the host's record of this operation)\n", ci.Host, ci.Marker.Path)
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// text is an attempt_started's command part in a timeline line.
func (c *CommandAttempt) text() string {
	if c == nil {
		return ""
	}
	t := "  host " + c.Address
	if c.HostKey != "" {
		t += " key " + c.HostKey
	}
	return t
}

// text is a command result's part in a timeline line.
func (c *CommandResult) text() string {
	if c == nil {
		return ""
	}
	t := " boundary " + c.Boundary
	if c.ExitCode != nil {
		t += fmt.Sprintf(" exit %d", *c.ExitCode)
	}
	if m := c.Marker; m != nil {
		t += " marker " + m.State + " " + m.Path
	}
	return t
}
