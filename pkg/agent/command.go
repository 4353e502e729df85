package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// Family is what a command tool declares it does to the host; the retry rule after a lost connection follows it.
type Family string

const (
	// FamilyRead gathers facts and changes nothing: it runs again freely.
	FamilyRead Family = "read"
	// FamilyConverge sets a state: after a lost connection it runs again only once its check says the state is
	// not reached yet.
	FamilyConverge Family = "converge"
	// FamilyEffect appends, pays, destroys or notifies: after a lost connection it never runs again unless the
	// host's operation marker says it did not run (the marker answers for it), or a person decides.
	FamilyEffect Family = "effect"
)

// Rule is the family's retry rule in one sentence.
func (f Family) Rule() string {
	switch f {
	case FamilyRead:
		return "Reads facts on the host: safe to run again at any time."
	case FamilyConverge:
		return "Sets a state on the host: after a lost connection the agent runs its check first, and runs it again only when the check says the state is not reached."
	case FamilyEffect:
		return "Has an effect on the host that a second run would repeat: after a lost connection it is never run again unless the host's operation marker answers for it, or a person decides."
	}
	return ""
}

// Execution boundaries of a command attempt: how far the command got, as the agent knows it.
const (
	// BoundaryNotStarted: the host never accepted the command (no connection, a host key that does not match,
	// a refused login or exec request). Nothing ran.
	BoundaryNotStarted = "not_started"
	// BoundaryStarted: the host accepted the command and no exit code came back (the connection was lost, the
	// attempt timed out): it may have run in part or whole.
	BoundaryStarted = "started"
	// BoundaryExitReceived: the command ended and its exit code came back.
	BoundaryExitReceived = "exit_received"
)

// HostDef is one host of a tools file, named by its alias: where command tools run.
type HostDef struct {
	Name string `json:"-"`
	// Local runs commands on this machine with sh -c, as the agent's own user: for tests and local work.
	Local bool `json:"local"`
	// Address is host:port; AddressEnv the environment variable that overrides it.
	Address    string `json:"address"`
	AddressEnv string `json:"address_env"`
	// User is the remote account.
	User string `json:"user"`
	// HostKey pins the host key by its fingerprint (SHA256:..., as ssh-keygen -lf prints it); KnownHosts names
	// a known_hosts file instead. One of them is required: a host key is never taken on trust.
	HostKey    string `json:"host_key"`
	KnownHosts string `json:"known_hosts"`
	// IdentityFile is the private key's file; IdentityFileEnv the environment variable that overrides it.
	IdentityFile    string `json:"identity_file"`
	IdentityFileEnv string `json:"identity_file_env"`
	// MarkerDir is where the host's operation markers are (pkg/agent/opmarker); set, the host's effect tools run
	// under MarkerHelper (default "retrysafe marker"), which runs each operation once.
	MarkerDir    string `json:"marker_dir"`
	MarkerHelper string `json:"marker_helper"`
}

// CommandSpec is a command tool's part of a Tool: the command a tools file declares.
type CommandSpec struct {
	Host    string
	Local   bool
	Account string
	Workdir string
	Family  Family
	// Template is the command line for sh, {{name}} standing for an argument (substituted quoted); Check the
	// converge check's, exit 0 when the state is reached and 1 when not.
	Template string
	Check    string
	// Secrets are environment variables the command reads as $NAME: their values reach the host on the
	// command's standard input, never in its command line, the journal or the fingerprint.
	Secrets []string
	// Marker says the host's effect runs under its operation marker.
	Marker bool
}

// CommandIntent is a command operation's part of its operation_created record: what runs where, journaled
// before the first attempt. Display is the command as it runs, secrets as the $NAME references the tools file
// wrote; resume runs what the journal says, not what the tools file says now.
type CommandIntent struct {
	Host    string   `json:"host"`
	Local   bool     `json:"local,omitempty"`
	Account string   `json:"account"`
	Workdir string   `json:"workdir,omitempty"`
	Family  Family   `json:"family"`
	Display string   `json:"display"`
	Check   string   `json:"check,omitempty"`
	Secrets []string `json:"secrets,omitempty"`
	// Marker is the operation's marker on the host, named by its idempotency key.
	Marker *MarkerRef `json:"marker,omitempty"`
}

// MarkerRef names an operation's marker on its host.
type MarkerRef struct {
	Dir  string `json:"dir"`
	ID   string `json:"id"`
	Path string `json:"path"`
}

// CommandAttempt is a command attempt's part of its attempt_started record, written once the host's key was
// checked and before the command is sent.
type CommandAttempt struct {
	Address string `json:"address"`
	// HostKey is the SHA256 fingerprint of the key the host presented (and the pin or known_hosts accepted);
	// empty when no connection was made, or for a local host.
	HostKey string `json:"host_key,omitempty"`
}

// CommandResult is how far a command attempt (or a converge check) got: its part of attempt_finished or of a
// command_check observation.
type CommandResult struct {
	Boundary     string `json:"boundary"`
	ExitCode     *int   `json:"exit_code,omitempty"`
	StdoutSHA256 string `json:"stdout_sha256,omitempty"`
	// Marker is what the host's marker helper said: ran, replayed, in_progress or refused.
	Marker *MarkerSeen `json:"marker,omitempty"`
}

// MarkerSeen is the marker helper's status line.
type MarkerSeen struct {
	State      string `json:"state"`
	Path       string `json:"path"`
	StartedAt  string `json:"started_at,omitempty"`
	FinishedAt string `json:"finished_at,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

// ObsCommandCheck is a converge command's check, run after a lost connection: exit 0, the state is reached.
const ObsCommandCheck = "command_check"

// CodeCommandUnknown is the code of an effect command that started and whose end is unknown, with no marker to
// answer for it; CodeMarkerInProgress of one whose marker says a run started and recorded no result.
const (
	CodeCommandUnknown   = "command_outcome_unknown"
	CodeMarkerInProgress = "marker_in_progress"
)

var (
	placeholderRE = regexp.MustCompile(`\{\{([a-z][a-z0-9_]{0,63})\}\}`)
	secretNameRE  = regexp.MustCompile(`^[A-Z_][A-Z0-9_]{0,63}$`)
)

// maxCommandBytes bounds a command or check template.
const maxCommandBytes = 16 << 10

// addHosts checks the tools file's hosts.
func (c *Catalog) addHosts(hosts map[string]*HostDef) error {
	c.hosts = map[string]*HostDef{}
	for name, h := range hosts {
		if h == nil || !toolNameRE.MatchString(name) {
			return fmt.Errorf("%w: host %q: a host alias is lower case letters, digits and _, and has fields", ErrToolsFile, name)
		}
		if err := h.check(); err != nil {
			return fmt.Errorf("%w: host %s: %v", ErrToolsFile, name, err)
		}
		h.Name = name
		c.hosts[name] = h
	}
	return nil
}

// check accepts a host's marker settings, and then a local host or an SSH one.
func (h *HostDef) check() error {
	if h.MarkerDir != "" && !path.IsAbs(h.MarkerDir) {
		return errors.New("marker_dir is an absolute path on the host")
	}
	if h.MarkerHelper != "" && h.MarkerDir == "" {
		return errors.New("marker_helper needs marker_dir")
	}
	if h.Local {
		return h.checkLocal()
	}
	return h.checkSSH()
}

// checkLocal refuses SSH fields on a local host: it runs as the agent's user.
func (h *HostDef) checkLocal() error {
	if h.Address != "" || h.AddressEnv != "" || h.User != "" || h.HostKey != "" || h.KnownHosts != "" || h.IdentityFile != "" || h.IdentityFileEnv != "" {
		return errors.New("a local host has no address, user, host key or identity: it runs as the agent's user")
	}
	return nil
}

// checkSSH checks that an SSH host says where it is, who logs in, how its key is pinned and which key logs in.
func (h *HostDef) checkSSH() error {
	return firstViolation(
		violation{h.Address == "" && h.AddressEnv == "", "give address (host:port), address_env or both"},
		violation{h.User == "", "user (the remote account) is required"},
		violation{(h.HostKey == "") == (h.KnownHosts == ""), "give host_key (SHA256:... of the host's key) or known_hosts (a file), one of them: a host key is never taken on trust"},
		violation{h.HostKey != "" && !strings.HasPrefix(h.HostKey, "SHA256:"), "host_key is the key's SHA256 fingerprint, SHA256:... (ssh-keygen -lf)"},
		violation{h.IdentityFile == "" && h.IdentityFileEnv == "", "give identity_file, identity_file_env or both: the private key the agent logs in with"},
	)
}

// commandTool reads a tool of kind command.
func (c *Catalog) commandTool(d toolDef) (Tool, error) {
	if d.Service != "" || d.Method != "" || d.Path != "" || d.RetryMode != "" || d.IdempotencyKey != nil || d.Approval {
		return Tool{}, errors.New("a command tool has host, family and command; no service, method, path, retry_mode, idempotency_key or approval")
	}
	h := c.hosts[d.Host]
	if h == nil {
		return Tool{}, fmt.Errorf("host %q is not among the file's hosts", d.Host)
	}
	spec := &CommandSpec{Host: h.Name, Local: h.Local, Account: h.User, Workdir: d.Workdir, Family: d.Family,
		Template: strings.TrimSpace(d.Command), Check: strings.TrimSpace(d.Check), Secrets: d.Secrets}
	t := Tool{Name: d.Name, Summary: strings.TrimSpace(d.Summary), Command: spec}
	mode, err := familyMode(d.Family)
	if err != nil {
		return Tool{}, err
	}
	t.Mode = mode
	if d.Family == FamilyEffect {
		spec.Marker = h.MarkerDir != ""
		t.Keyed = spec.Marker // the marker is named by the action's key: one per action, whichever agent sends it
	}
	if err := spec.check(t.Summary); err != nil {
		return Tool{}, err
	}
	if err := t.compile(d.InputSchema); err != nil {
		return Tool{}, err
	}
	return t, nil
}

// familyMode is the retry mode a command family runs under.
func familyMode(f Family) (RetryMode, error) {
	switch f {
	case FamilyRead:
		return ReadOnly, nil
	case FamilyConverge:
		return Converge, nil
	case FamilyEffect:
		return Destructive, nil
	}
	return "", fmt.Errorf("family %q: want read, converge or effect", f)
}

// check accepts a command tool's summary, command line, check (a converge tool's only), workdir and secrets.
func (s *CommandSpec) check(summary string) error {
	err := firstViolation(
		violation{summary == "", "summary is required: it is what a model reads to choose the tool"},
		violation{s.Template == "" || len(s.Template) > maxCommandBytes || strings.ContainsRune(s.Template, 0),
			fmt.Sprintf("command is a shell command line of 1 to %d bytes", maxCommandBytes)},
		violation{(s.Check != "") != (s.Family == FamilyConverge), "a converge tool declares check (exit 0: the state is reached, 1: not yet); other families have none"},
		violation{len(s.Check) > maxCommandBytes || strings.ContainsRune(s.Check, 0),
			fmt.Sprintf("check is a shell command line of at most %d bytes", maxCommandBytes)},
		violation{s.Workdir != "" && (!path.IsAbs(s.Workdir) || strings.ContainsAny(s.Workdir, "\x00\n")), "workdir is an absolute path on the host"},
	)
	if err != nil {
		return err
	}
	for _, name := range s.Secrets {
		if !secretNameRE.MatchString(name) {
			return fmt.Errorf("secret %q: a secret is the name of an environment variable (A-Z, 0-9, _), read as $%s by the command", name, name)
		}
	}
	return nil
}

// placeholders are the argument names the command and its check take.
func (s *CommandSpec) placeholders() []string {
	var out []string
	for _, m := range placeholderRE.FindAllStringSubmatch(s.Template+"\n"+s.Check, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

// prepareCommand checks args against a command tool and computes the intent's fingerprint: SHA-256 over the
// canonical JSON of tool, host, account, workdir, family, the command and check templates, the secrets'
// names and the arguments. Secret values are not part of it: they are referenced, never stored.
func (t Tool) prepareCommand(args json.RawMessage) (request, error) {
	r, err := t.prepare(args) // arguments, path parameters (the placeholders) required
	if err != nil {
		return request{}, err
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(r.args, &fields)
	s := t.Command
	if r.command, err = substitute(s.Template, fields); err != nil {
		return request{}, fmt.Errorf("%w: %s: %v", ErrBadArguments, t.Name, err)
	}
	if r.check, err = substitute(s.Check, fields); err != nil {
		return request{}, fmt.Errorf("%w: %s: %v", ErrBadArguments, t.Name, err)
	}
	secrets := s.Secrets
	if secrets == nil {
		secrets = []string{}
	}
	fp, err := auditchain.Canonical(map[string]any{"tool": t.Name, "kind": "command", "host": s.Host, "account": s.Account,
		"workdir": s.Workdir, "family": s.Family, "command": s.Template, "check": s.Check, "secrets": secrets, "args": r.args})
	if err != nil {
		return request{}, err
	}
	r.fingerprint, r.path, r.body = sha256Hex(fp), "", nil
	return r, nil
}

// substitute writes template with each {{name}} replaced by the argument, quoted for sh.
func substitute(template string, fields map[string]json.RawMessage) (string, error) {
	var bad error
	out := placeholderRE.ReplaceAllStringFunc(template, func(m string) string {
		name := m[2 : len(m)-2]
		var v string
		if err := json.Unmarshal(fields[name], &v); err != nil || strings.ContainsRune(v, 0) {
			bad = fmt.Errorf("argument %q is a string without NUL", name)
		}
		return shQuote(v)
	})
	return out, bad
}

// shQuote quotes s as one word for sh.
func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// intent is the operation's command record: the host's marker named by key when the tool runs under one.
func (s *CommandSpec) intent(req request, h *HostDef, key, account string) *CommandIntent {
	ci := &CommandIntent{Host: s.Host, Local: s.Local, Account: account, Workdir: s.Workdir, Family: s.Family,
		Display: req.command, Check: req.check}
	for _, name := range s.Secrets {
		ci.Secrets = append(ci.Secrets, "env:"+name)
	}
	if s.Marker && key != "" {
		ci.Marker = &MarkerRef{Dir: h.MarkerDir, ID: key, Path: path.Join(h.MarkerDir, key+".marker")}
	}
	return ci
}

// Rule is the tool's retry rule in one sentence: its family's for a command tool, its retry mode's otherwise.
func (t Tool) Rule() string {
	if t.Command != nil {
		return t.Command.Family.Rule()
	}
	return t.Mode.Rule()
}

// host returns the host named alias.
func (c *Catalog) host(alias string) (*HostDef, bool) {
	h, ok := c.hosts[alias]
	return h, ok
}

// HasRequests reports whether the catalog has a tool that sends HTTP requests (and so needs an API key).
func (c *Catalog) HasRequests() bool {
	for _, t := range c.tools {
		if t.Command == nil {
			return true
		}
	}
	return false
}
