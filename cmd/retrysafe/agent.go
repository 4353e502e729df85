package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/agent/agentmcp"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
)

// Exit codes of `retrysafe agent`, by how the operation ended (usage and internal errors are 1). Unknown is
// 6, not 2: 2 is what a Go program that panics exits with, and what the other commands exit with on bad usage.
const (
	exitNeedsHuman = 3
	exitRefused    = 4
	exitFailed     = 5
	exitUnknown    = 6
)

const agentEnv = `  TICKETS_URL PAYMENTS_URL DEPLOYS_URL   the demo services (default http://127.0.0.1: and RETRYSAFE_PORT_BASE
                            plus 1, 2 and 3: 8081 8082 8083); with --tools FILE, the variables its services name
                            (base_url_env)
  RETRYSAFE_PORT_BASE       where the demo runs (default 8080), as for serve
  AGENT_API_KEY             the bearer key requests carry (never written to the journal); not needed when every
                            tool of --tools FILE is a command tool
  with --tools FILE, the variables its hosts and command tools name (address_env, identity_file_env, secrets);
                            a secret reaches the host on the command's standard input, never the journal
  AGENT_NAMESPACE           what idempotency keys are derived from, with the action id (default: the key id of
                            AGENT_API_KEY); agents given one action in one namespace send one key, so it runs once
  AGENT_NAMESPACE_SECRET    the secret keys are derived under (16 bytes or more; required with AGENT_NAMESPACE, given
                            to every agent of the namespace; default: AGENT_API_KEY); never journaled
  AGENT_BUDGET              attempts per operation before a person decides (default 5)
  AGENT_MAX_WAIT            how long one call waits for a settled answer (default 2m)
  AGENT_LOCK_WAIT           how long to wait for another agent holding the journal (default 30s; mcp 10s)
  AGENT_MAX_BODY_BYTES      largest arguments and request body the agent sends (default 1048576, the services'
                            BODY_LIMIT_BYTES); larger ones are refused before anything is journaled or sent
  OTEL_TRACES_EXPORTER      otlp or console: each action is one trace, its traceparent journaled (default off)
  RETRYSAFE_AGENT_FAILPOINTS   crash points for tests: agent.before_journal|before_send|after_send|after_answer=pause|exit`

// agentCommand is `retrysafe agent do|resume|show`: pkg/agent for shell-driven agents and scripts.
func agentCommand() command {
	return command{
		name:     "agent",
		synopsis: "agent do|resume|retry|resolve|verify|show --journal PATH [--tools FILE] ...",
		summary: "make writes an agent can retry without doubling them: do --action ACTION_ID [--supersedes ACTION_ID] " +
			"[--parent-run RUN_ID] [--remediates OP_ID] [--worker-journal PATH | --parent-operation OPERATION_ID] TOOL 'JSON' (exit 0 succeeded, 3 needs_human or still in progress, 4 refused or changed " +
			"intent, 5 failed, 6 unknown: the service does not know yet whether it happened, call again with the same " +
			"action, 1 usage or internal error), resume (settle every unfinished operation; exit 3 while one waits for a " +
			"person or the service, else 6 while one is unknown), retry [--budget N] [--by NAME] [--reason TEXT] ACTION_ID " +
			"(take a needs_human action out of needs_human with the same key, journaled with who asked; exit codes as do), resolve --state succeeded|failed --evidence TEXT " +
			"[--remote-ref REF] [--by NAME] ACTION_ID (record a person's decision on a needs_human action in the journal), " +
			"verify (ask the services for every operation they acknowledged and send again, under its key, each one they lost; exit 0 none lost, 7 lost and made again, 3 one not made again or not checked), " +
			"show [OPERATION_ID|ACTION_ID]. --tools FILE reads the tools from a tools file (pkg/agent/demo-tools.yaml " +
			"is the default, embedded). A journal acts for the API key " +
			"its operations were made with; do and resume under another key are refused (exit 1) unless " +
			"--same-account says the key is a new one of the same account",
		noConfig: true,
		check:    checkAgent,
		run:      runAgent,
		env:      agentEnv,
	}
}

// mcpCommand is `retrysafe mcp --journal PATH`: the same tools over MCP on stdio.
func mcpCommand() command {
	return command{
		name:     "mcp",
		synopsis: "mcp --journal PATH [--tools FILE] [--same-account]",
		summary: fmt.Sprintf("serve the agent tools (those of --tools FILE, or the demo services'), get_operation and "+
			"retry_action over the Model Context Protocol on stdin/stdout "+
			"(a message over %d bytes or %d levels deep is refused alone; requests read before stdin ends are answered; "+
			"requests run concurrently, so answers may come in another order: match them by id)",
			agentmcp.MaxMessageBytes, agentmcp.MaxMessageDepth),
		noConfig: true,
		check: func(args []string) error {
			_, err := parseAgentFlags("mcp", args, io.Discard)
			return err
		},
		run: runMCP,
		env: agentEnv,
	}
}

// agentUsage is a bad agent invocation: exit 1, as the agent's exit codes reserve 2-5 for outcomes.
func agentUsage(format string, args ...any) error {
	return exitError{code: 1, err: fmt.Errorf(format+" (retrysafe help agent)", args...)}
}

type agentFlags struct {
	journal     string
	action      string
	supersedes  string
	remediates  string
	parentRun   string
	parentOp    string
	worker      string
	sameAccount bool
	tools       string
	grant       string
	// decision is agent resolve's.
	decision agent.Decision
	// retry is agent retry's.
	retry agent.RetryRequest
	rest  []string
}

func parseAgentFlags(name string, args []string, out io.Writer) (agentFlags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	var f agentFlags
	fs.StringVar(&f.journal, "journal", "", "the journal file (created when missing)")
	if name == "agent do" {
		fs.StringVar(&f.action, "action", "", "ACTION_ID: your name for this intended action; the same name continues it")
		fs.StringVar(&f.supersedes, "supersedes", "", "ACTION_ID whose intent this new action replaces (a changed intent)")
		fs.StringVar(&f.parentRun, "parent-run", "", "RUN_ID of the agent run that delegated this action, journaled with it")
		fs.StringVar(&f.parentOp, "parent-operation", "", "OPERATION_ID (aop_...) of the parent's operation this worker carries out: "+
			"the parent owns its retries")
		fs.StringVar(&f.worker, "worker-journal", "", "PATH: hand the action to a worker that journals it there; nothing is sent from here")
		fs.StringVar(&f.remediates, "remediates", "", "OP_ID: the service's duplicate_effect_confirmed operation this refund_payment corrects (Remediates-Operation-Id)")
	}
	if name == "agent retry" {
		fs.IntVar(&f.retry.Budget, "budget", 0, "attempts it may make from now (default AGENT_BUDGET)")
		fs.StringVar(&f.retry.By, "by", "", "who asks (default: the operating system user)")
		fs.StringVar(&f.retry.Reason, "reason", "", "why it should go again now, journaled")
	}
	// Every subcommand takes --tools, so one command line serves them all; show and resolve send nothing and
	// only check that the file can be read.
	fs.StringVar(&f.tools, "tools", "", "a tools file (YAML or JSON) to read the tools from instead of the demo services'")
	if name == "agent resolve" {
		fs.StringVar(&f.decision.State, "state", "", "succeeded or failed: what you learned happened")
		fs.StringVar(&f.decision.Evidence, "evidence", "", "what the decision rests on (the provider's dashboard, a call to the bank)")
		fs.StringVar(&f.decision.RemoteRef, "remote-ref", "", "the other side's record of the effect, when there is one")
		fs.StringVar(&f.decision.By, "by", "", "who decides (default: the operating system user)")
	}
	if name != "agent show" && name != "agent resolve" {
		fs.StringVar(&f.grant, "grant", "", "GRANT_ID (grt_...): a person's grant for a group of writes, sent as Grant-Id "+
			"with each write that takes approvals (docs/agents.md, Grants)")
	}
	if name != "agent show" {
		fs.BoolVar(&f.sameAccount, "same-account", false, "AGENT_API_KEY belongs to the account the journal's operations "+
			"were made in, though the journal names another key or none (a rotated key, an older journal): adopt it, once "+
			"the services show this key the operations resume would send again")
	}
	if err := fs.Parse(args); err != nil {
		return f, agentUsage("%s: %v", name, err)
	}
	f.rest = fs.Args()
	if f.journal == "" {
		return f, agentUsage("%s needs --journal PATH", name)
	}
	return f, nil
}

// agentChecks check each agent subcommand's flags and arguments, and that its tools file can be read.
var agentChecks = map[string]func(f agentFlags) error{
	"do":      checkAgentDo,
	"resume":  checkAgentResume,
	"retry":   checkAgentRetry,
	"resolve": checkAgentResolve,
	"show":    checkAgentShow,
	"verify":  checkAgentResume,
}

func checkAgent(args []string) error {
	if len(args) == 0 {
		return agentUsage("agent needs a subcommand: do, resume, retry, resolve, verify or show")
	}
	check, ok := agentChecks[args[0]]
	if !ok {
		return agentUsage("unknown agent subcommand %q: want do, resume, retry, resolve, verify or show", args[0])
	}
	f, err := parseAgentFlags("agent "+args[0], args[1:], io.Discard)
	if err != nil {
		return err
	}
	return check(f)
}

// checkAgentDo wants an action, a tool of the tools file and JSON arguments.
func checkAgentDo(f agentFlags) error {
	if f.action == "" {
		return agentUsage("agent do needs --action ACTION_ID")
	}
	if len(f.rest) != 2 {
		return agentUsage("agent do takes TOOL 'JSON' after its flags, got %q", f.rest)
	}
	tools, err := loadTools(f.tools)
	if err != nil {
		return err
	}
	if _, ok := tools.Tool(f.rest[0]); !ok {
		return agentUsage("unknown tool %q: one of %s", f.rest[0], strings.Join(tools.Names(), ", "))
	}
	if !json.Valid([]byte(f.rest[1])) {
		return agentUsage("agent do: %q is not JSON", f.rest[1])
	}
	return nil
}

func checkAgentResume(f agentFlags) error {
	if len(f.rest) != 0 {
		return agentUsage("agent resume and verify take no arguments")
	}
	return toolsReadable(f.tools)
}

func checkAgentRetry(f agentFlags) error {
	if len(f.rest) != 1 {
		return agentUsage("agent retry takes one ACTION_ID (or OPERATION_ID) after its flags, got %q", f.rest)
	}
	if f.retry.Budget < 0 || f.retry.Budget > 100 {
		return agentUsage("agent retry: --budget is 1 to 100 attempts")
	}
	return toolsReadable(f.tools)
}

func checkAgentResolve(f agentFlags) error {
	if len(f.rest) != 1 {
		return agentUsage("agent resolve takes one ACTION_ID (or OPERATION_ID) after its flags, got %q", f.rest)
	}
	if err := f.decision.Validate(); err != nil {
		return agentUsage("agent resolve: %v", err)
	}
	return toolsReadable(f.tools)
}

func checkAgentShow(f agentFlags) error {
	if len(f.rest) > 1 {
		return agentUsage("agent show takes at most one OPERATION_ID or ACTION_ID")
	}
	return toolsReadable(f.tools)
}

// toolsReadable checks that the tools file (or the demo tools) can be read.
func toolsReadable(path string) error {
	_, err := loadTools(path)
	return err
}

// openAgent reads the agent's configuration and opens its journal, for the commands that send (agent do and
// resume, mcp); a missing key, a path that is not a journal or a journal of another key is a usage error, a
// journal that cannot be opened exit 1.
func openAgent(inv invocation, f agentFlags, command string, lockWait time.Duration) (*agent.Agent, error) {
	cfg, err := agentConfig(inv.getenv, command, lockWait)
	if err != nil {
		return nil, err
	}
	if cfg.Tools, err = loadTools(f.tools); err != nil {
		return nil, err
	}
	ports, err := readPorts(inv.getenv)
	if err != nil {
		return nil, agentUsage("%v", err)
	}
	cfg.BaseURLs = cfg.Tools.BaseURLs(withDemoURLs(inv.getenv, ports))
	if cfg.APIKey == "" && cfg.Tools.HasRequests() {
		return nil, agentUsage("AGENT_API_KEY is unset: the services need a bearer key")
	}
	cfg.SameAccount, cfg.GrantID = f.sameAccount, f.grant
	a, err := agent.Open(f.journal, cfg)
	switch {
	case errors.Is(err, agent.ErrOtherPrincipal), errors.Is(err, agent.ErrNotJournal):
		return nil, agentUsage("%v", err)
	case err != nil:
		return nil, exitError{code: 1, err: err}
	}
	return a, nil
}

// agentConfig reads the agent's environment; like loadConfig, once, here.
func agentConfig(getenv func(string) string, command string, lockWait time.Duration) (agent.Config, error) {
	cfg := agent.Config{
		APIKey: getenv("AGENT_API_KEY"), AuthorityRef: "env:AGENT_API_KEY", Command: command, LockWait: lockWait,
		Namespace: getenv("AGENT_NAMESPACE"), NamespaceSecret: getenv("AGENT_NAMESPACE_SECRET"),
		NamespaceSecretRef: "env:AGENT_NAMESPACE_SECRET",
		Getenv:             getenv,
		Hook:               func(point string) { failpoint.Hit("agent." + point) },
		Warn:               func(msg string) { fmt.Fprintln(os.Stderr, "retrysafe: warning:", agent.Printable(msg)) },
	}
	if v := getenv("AGENT_BUDGET"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return cfg, agentUsage("AGENT_BUDGET=%q: want 1 to 100 attempts", v)
		}
		cfg.Budget = n
	}
	if v := getenv("AGENT_MAX_BODY_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1024 || n > 1<<30 {
			return cfg, agentUsage("AGENT_MAX_BODY_BYTES=%q: want 1024 to 1073741824 bytes", v)
		}
		cfg.MaxBodyBytes = n
	}
	for name, dst := range map[string]*time.Duration{"AGENT_MAX_WAIT": &cfg.MaxWait, "AGENT_LOCK_WAIT": &cfg.LockWait} {
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return cfg, agentUsage("%s=%q: want a duration such as 30s", name, v)
			}
			*dst = d
		}
	}
	if err := failpoint.Configure(getenv("RETRYSAFE_AGENT_FAILPOINTS")); err != nil {
		return cfg, agentUsage("RETRYSAFE_AGENT_FAILPOINTS: %v", err)
	}
	return cfg, nil
}

// runAgent runs agent do, resume or show. What it prints carries text from models and services (action ids,
// problem codes, operation ids): its JSON and its error are escaped so no control or bidirectional character
// reaches a terminal raw.
func runAgent(ctx context.Context, inv invocation) (err error) {
	defer func() { err = printableError(err) }()
	sub := inv.args[0]
	f, err := parseAgentFlags("agent "+sub, inv.args[1:], io.Discard)
	if err != nil {
		return err
	}
	if sub == "show" {
		return runAgentShow(inv.stdout, f)
	}
	a, err := openAgent(inv, f, "agent "+sub, 30*time.Second)
	if err != nil {
		return err
	}
	defer a.Close()
	enc := json.NewEncoder(printableJSON{inv.stdout})
	switch sub {
	case "resolve":
		return runAgentResolve(a, enc, f)
	case "resume":
		return runAgentResume(ctx, a, enc)
	case "retry":
		return runAgentRetry(ctx, a, enc, f)
	case "verify":
		return runAgentVerify(ctx, a, enc)
	}
	return runAgentDo(ctx, a, enc, f)
}

// runAgentResolve records a person's decision on an action (by default, the operating system user's).
func runAgentResolve(a *agent.Agent, enc *json.Encoder, f agentFlags) error {
	d := f.decision
	if d.By == "" {
		d.By = osUser()
	}
	r, err := a.Resolve(f.rest[0], d)
	if err != nil {
		return exitError{code: 1, err: err}
	}
	return enc.Encode(r)
}

// runAgentResume settles every unfinished operation, prints each result, and exits by what still waits.
func runAgentResume(ctx context.Context, a *agent.Agent, enc *json.Encoder) error {
	results, err := a.Resume(ctx)
	for _, r := range results {
		if encErr := enc.Encode(r); encErr != nil {
			return encErr
		}
	}
	if err != nil {
		return exitError{code: 1, err: fmt.Errorf("agent resume: %w", err)}
	}
	return resumeExit(a.Operations())
}

// resumeExit is exit 3 while any operation of the journal waits for a person or for work the service is doing,
// settled now or before; else 6 while the service holds any as unknown.
func resumeExit(ops []*agent.Operation) error {
	var waiting, unknown []string
	for _, op := range ops {
		switch st := op.State(); st {
		case agent.StateNeedsHuman, agent.StateInProgress, agent.StateUnresolved:
			waiting = append(waiting, op.ActionID+" ("+st+")")
		case agent.StateUnknown:
			unknown = append(unknown, op.ActionID)
		}
	}
	if len(waiting) > 0 {
		return exitError{code: exitNeedsHuman, err: fmt.Errorf("agent resume: waiting for a person or the service: %s; see agent show",
			strings.Join(append(waiting, unknown...), ", "))}
	}
	if len(unknown) > 0 {
		return exitError{code: exitUnknown, err: fmt.Errorf("agent resume: the service does not know yet whether these happened: %s; "+
			"run resume again later, see agent show", strings.Join(unknown, ", "))}
	}
	return nil
}

// runAgentRetry takes a needs_human action out of needs_human with the same key, asked by a person (by default,
// the operating system user).
func runAgentRetry(ctx context.Context, a *agent.Agent, enc *json.Encoder, f agentFlags) error {
	r := f.retry
	if r.By == "" {
		r.By = osUser()
	}
	res, err := a.Retry(ctx, f.rest[0], r)
	switch {
	case errors.Is(err, agent.ErrNotRetryable), errors.Is(err, agent.ErrNotNeedsHuman):
		if res.OperationID != "" {
			_ = enc.Encode(res)
		}
		return exitError{code: exitRefused, err: err}
	case errors.Is(err, agent.ErrBadArguments), errors.Is(err, agent.ErrUnknownAction):
		return agentUsage("%v", err)
	}
	return endOf(enc, res, err)
}

// runAgentDo makes the action's write; a changed intent prints a refused result naming how to supersede it.
func runAgentDo(ctx context.Context, a *agent.Agent, enc *json.Encoder, f agentFlags) error {
	res, err := a.Do(ctx, f.action, f.rest[0], json.RawMessage(f.rest[1]), agent.DoOptions{Supersedes: f.supersedes, ParentRun: f.parentRun, Remediates: f.remediates,
		ParentOperation: f.parentOp, DelegateTo: f.worker})
	switch {
	case errors.Is(err, agent.ErrChangedIntent):
		_ = enc.Encode(agent.Result{OperationID: res.OperationID, ActionID: f.action, Tool: res.Tool, State: agent.StateRefused,
			Code: "changed_intent", Reason: err.Error(), IdempotencyKey: res.IdempotencyKey, Attempts: res.Attempts,
			NextStep: "nothing sent: a changed intent needs a new --action that --supersedes " + f.action})
		return exitError{code: exitRefused, err: err}
	case errors.Is(err, agent.ErrBadArguments), errors.Is(err, agent.ErrUnknownAction):
		return agentUsage("%v", err)
	}
	return endOf(enc, res, err)
}

// endOf prints how a call of do or retry ended and exits by its state.
func endOf(enc *json.Encoder, res agent.Result, err error) error {
	if err != nil {
		if res.OperationID != "" {
			_ = enc.Encode(res)
		}
		return exitError{code: 1, err: err}
	}
	if err := enc.Encode(res); err != nil {
		return err
	}
	switch res.State {
	case agent.StateSucceeded:
		return nil
	case agent.StateRefused:
		return exitError{code: exitRefused, err: fmt.Errorf("refused: %s", res.Reason)}
	case agent.StateFailed:
		return exitError{code: exitFailed, err: fmt.Errorf("failed: %s", res.Reason)}
	case agent.StateUnknown:
		return exitError{code: exitUnknown, err: fmt.Errorf("unknown: %s", res.NextStep)}
	default:
		return exitError{code: exitNeedsHuman, err: fmt.Errorf("%s: %s", res.State, res.NextStep)}
	}
}

// runAgentShow reads the journal without locking it, so it works while an agent holds it.
func runAgentShow(w io.Writer, f agentFlags) error {
	j, err := agent.ReadJournal(f.journal)
	if err != nil {
		return exitError{code: 1, err: err}
	}
	if len(f.rest) == 0 {
		j.WriteSummary(w)
		return nil
	}
	op, ok := j.Operation(f.rest[0])
	if !ok {
		return exitError{code: 1, err: fmt.Errorf("agent show: no operation or action %q in %s", f.rest[0], f.journal)}
	}
	op.WriteTimeline(w)
	return nil
}

func runMCP(ctx context.Context, inv invocation) error {
	f, err := parseAgentFlags("mcp", inv.args, io.Discard)
	if err != nil {
		return err
	}
	if len(f.rest) != 0 {
		return agentUsage("mcp takes no arguments besides its flags")
	}
	a, err := openAgent(inv, f, "mcp", 10*time.Second)
	if err != nil {
		return err
	}
	defer a.Close()
	fmt.Fprintf(os.Stderr, "retrysafe mcp: serving on stdio, journal %s, run %s\n", agent.Printable(f.journal), a.RunID())
	t := &agentmcp.Transport{In: os.Stdin, Out: inv.stdout, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	return agentmcp.NewServer(a, versionString()).Run(ctx, t)
}

// loadTools reads the tools file at path, or gives the demo services' tools when path is empty; a file that
// cannot be read or declares an unsafe tool is a usage error.
func loadTools(path string) (*agent.Catalog, error) {
	if path == "" {
		return agent.DemoTools(), nil
	}
	c, err := agent.LoadTools(path)
	if err != nil {
		return nil, agentUsage("--tools: %v", err)
	}
	return c, nil
}

// osUser names the operating system user, for who decided or asked.
func osUser() string {
	if u, err := user.Current(); err == nil {
		return "os:" + u.Username
	}
	return "os:unknown"
}

// printableError is err with its message made agent.Printable; its exit code and errors.Is still hold.
func printableError(err error) error {
	if err == nil || agent.Printable(err.Error()) == err.Error() {
		return err
	}
	return exitError{code: exitCode(err), err: printableMessage{err}}
}

type printableMessage struct{ err error }

func (e printableMessage) Error() string { return agent.Printable(e.err.Error()) }
func (e printableMessage) Unwrap() error { return e.err }

// printableJSON writes JSON values (one per Write, as json.Encoder does) with every character a terminal could
// act on (C1 controls, DEL, bidirectional and other format characters) written as a \u escape: the same JSON
// to a parser, inert on a terminal. json.Encoder already escapes the C0 controls; outside strings JSON is
// ASCII, so only string contents change.
type printableJSON struct{ w io.Writer }

func (p printableJSON) Write(b []byte) (int, error) {
	var out []byte
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == '\n' || (strconv.IsPrint(r) && !(r == utf8.RuneError && size == 1)) {
			out = append(out, b[i:i+size]...)
		} else {
			for _, u := range utf16.Encode([]rune{r}) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		}
		i += size
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}
