package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/ids"
)

// Errors Do returns before anything is sent.
var (
	// ErrChangedIntent: the action id is in the journal with other arguments. Nothing was sent; a changed
	// intent is a new action (a new action id, superseding the old one), never a retry.
	ErrChangedIntent = errors.New("agent: changed intent")
	// ErrBadArguments: an unknown tool, arguments that are not a JSON object, a missing path parameter.
	ErrBadArguments = errors.New("agent: bad arguments")
	// ErrUnknownAction: show, get_operation or supersedes named an action id the journal does not have.
	ErrUnknownAction = errors.New("agent: unknown action")
)

// Config is everything an Agent needs besides its journal. The API key is used for requests and never written.
type Config struct {
	// Tools are the tools the agent offers and the services they write to (default: DemoTools, the demo
	// services').
	Tools *Catalog
	// BaseURLs are the services' base URLs by service name (default: each service's base_url in the tools file;
	// Catalog.BaseURLs reads them from the environment).
	BaseURLs map[string]string
	// TicketsURL, PaymentsURL and DeploysURL are the demo services' base URLs: BaseURLs["tickets"], ... .
	TicketsURL, PaymentsURL, DeploysURL string
	APIKey                              string
	// AuthorityRef says where APIKey came from ("env:AGENT_API_KEY"); it is what the journal records.
	AuthorityRef string
	// Namespace is what an action's idempotency key is derived from, with its action id: agents given one action
	// in one namespace send one key, and the service runs it once (1 to 200 printable ASCII characters; default:
	// the key id of APIKey, see namespace.go for why not the account).
	Namespace string
	// NamespaceSecret is the secret the key is derived under (namespace.go): at least 16 bytes, never journaled.
	// Required with Namespace; with the default namespace it is APIKey.
	NamespaceSecret string
	// NamespaceSecretRef says where NamespaceSecret came from ("env:AGENT_NAMESPACE_SECRET"); the journal
	// records it with each derived key.
	NamespaceSecretRef string
	// Budget is the number of attempts per operation before it goes to a person (default 5).
	Budget int
	// AttemptTimeout bounds one HTTP attempt (default 30s); past it the attempt is sent_no_response.
	AttemptTimeout time.Duration
	// MaxWait bounds how long one call waits in backoff, Retry-After and polling (default 2m); an operation
	// still unsettled then is left for resume (in_progress) or a person (needs_human).
	MaxWait time.Duration
	// BackoffBase and BackoffMax shape the full-jitter exponential backoff (defaults 200ms and 5s).
	BackoffBase, BackoffMax time.Duration
	// LockWait is how long Open waits for another process holding the journal (default 0: refuse at once).
	LockWait time.Duration
	// SameAccount says APIKey belongs to the account the journal's operations were made in, though the journal
	// records another key for them, or none (a journal from before keys were recorded): a rotated key. Open
	// then binds the journal to APIKey instead of refusing it with ErrOtherPrincipal, once the services show
	// APIKey the operations resume would send again (a key of another account sees none: still refused).
	SameAccount bool
	// MaxBodyBytes bounds a call's arguments and the request body made from them (default 1 MiB, the services'
	// default BODY_LIMIT_BYTES): larger ones are refused before anything is journaled or sent.
	MaxBodyBytes int
	// Warn receives what the operator should know but that stops nothing, such as a journal others could write,
	// made 0600 (default: slog.Warn).
	Warn func(msg string)
	// HTTPClient sends the requests (default: no keep-alive, so net/http never resends on its own; no client
	// timeout, AttemptTimeout applies).
	HTTPClient *http.Client
	// Command is recorded with the run ("agent do", "mcp").
	Command string
	// Getenv reads what command tools take from the environment: their secrets, and a host's address_env and
	// identity_file_env (default: nothing is set).
	Getenv func(string) string
	// GrantID is a grant (grt_...) a person gave this agent for a group of writes (grant.go): sent as Grant-Id
	// with each attempt of a tool that takes approvals, unless an approval goes with it.
	GrantID string
	// Hook, when set, is called at the named crash points: "before_journal", "before_send", "after_send",
	// "after_answer". Tests stop the process there (failpoint.Hit).
	Hook func(point string)
}

func (c *Config) defaults() {
	if c.Tools == nil {
		c.Tools = DemoTools()
	}
	c.BaseURLs = c.serviceURLs()
	c.defaultLimits()
	c.defaultDependencies()
}

// serviceURLs are the tools file's base URLs, overridden by the demo services' fields and then by BaseURLs.
func (c *Config) serviceURLs() map[string]string {
	urls := c.Tools.BaseURLs(func(string) string { return "" })
	for name, u := range map[string]string{Tickets: c.TicketsURL, Payments: c.PaymentsURL, Deploys: c.DeploysURL} {
		if u != "" {
			urls[name] = u
		}
	}
	for name, u := range c.BaseURLs {
		urls[name] = strings.TrimRight(u, "/")
	}
	return urls
}

// defaultLimits sets the budget, the timeouts, the backoff and the body limit left unset.
func (c *Config) defaultLimits() {
	if c.Budget <= 0 {
		c.Budget = 5
	}
	if c.AttemptTimeout <= 0 {
		c.AttemptTimeout = 30 * time.Second
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 2 * time.Minute
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = 200 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 1 << 20
	}
}

// defaultDependencies sets the HTTP client, the authority reference, the environment, the hook and the warning
// sink left unset.
func (c *Config) defaultDependencies() {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: newTransport()}
	}
	if c.AuthorityRef == "" {
		c.AuthorityRef = "config:APIKey"
	}
	if c.Getenv == nil {
		c.Getenv = func(string) string { return "" }
	}
	if c.Hook == nil {
		c.Hook = func(string) {}
	}
	if c.Warn == nil {
		c.Warn = func(msg string) { slog.Warn(msg) }
	}
}

// Agent makes writes through a journal it holds locked. It is safe for concurrent use: calls for different
// actions run at once, calls for one action one after the other.
type Agent struct {
	cfg       Config
	j         *journal
	runID     string
	principal Principal

	mu      sync.Mutex // guards v and journal appends
	v       *view
	actions map[string]*sync.Mutex
}

// Open opens (creating) and locks the journal at path and starts an agent run in it. Another process holding
// the journal makes Open wait up to cfg.LockWait and then fail with ErrJournalLocked: two agents never write
// one journal at once, so neither can double an effect through it. A file that is not a journal, or a
// symbolic link, is refused with ErrNotJournal and left as it is; a journal whose operations were made with
// another API key, with ErrOtherPrincipal.
func Open(path string, cfg Config) (*Agent, error) {
	cfg.defaults()
	if err := cfg.checkSecrets(); err != nil {
		return nil, err
	}
	j, err := openJournal(path, cfg.LockWait, time.Now, cfg.Warn)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, j: j, v: newView(), actions: map[string]*sync.Mutex{}, runID: ids.New("run_"),
		principal: principalOf(cfg.APIKey)}
	a.defaultNamespace()
	if err := a.startRun(); err != nil {
		j.close()
		return nil, err
	}
	return a, nil
}

// checkSecrets refuses an API key a header cannot carry, and a namespace that is malformed or has no secret of
// the length keys are derived under.
func (c *Config) checkSecrets() error {
	if !httpguts.ValidHeaderFieldValue(c.APIKey) {
		return errors.New("agent: the API key holds a character an HTTP header cannot carry (a line break?)")
	}
	if c.Namespace != "" {
		if err := checkNamespace(c.Namespace); err != nil {
			return err
		}
		if c.NamespaceSecret == "" {
			return errors.New("agent: a namespace needs its secret (AGENT_NAMESPACE_SECRET), given to every agent of " +
				"the namespace: keys are derived under it, so no one without it can compute them")
		}
	}
	if c.NamespaceSecret != "" && len(c.NamespaceSecret) < minNamespaceSecret {
		return fmt.Errorf("agent: the namespace secret is at least %d bytes", minNamespaceSecret)
	}
	if c.GrantID != "" && !validGrantID(c.GrantID) {
		return errors.New("agent: a grant id is grt_ and a UUID, as POST /v1/grants answered it")
	}
	return nil
}

// defaultNamespace makes the API key's key id the namespace when none is given, and the API key its secret, and
// warns when keys would be derived without any secret.
func (a *Agent) defaultNamespace() {
	if a.cfg.Namespace == "" {
		a.cfg.Namespace = a.principal.KeyID
		if a.cfg.NamespaceSecret == "" {
			a.cfg.NamespaceSecret, a.cfg.NamespaceSecretRef = a.cfg.APIKey, a.cfg.AuthorityRef
		}
	}
	if a.cfg.NamespaceSecretRef == "" {
		a.cfg.NamespaceSecretRef = "config:NamespaceSecret"
	}
	if a.cfg.NamespaceSecret == "" && a.cfg.Tools.hasKeyed() && !a.cfg.Tools.HasRequests() {
		a.cfg.Warn("agent: no API key and no namespace secret: idempotency keys (and host markers named by them) are " +
			"derived without a secret, so anyone who knows the namespace and an action id can compute them; set AGENT_NAMESPACE_SECRET")
	}
}

// startRun reads the journal into the view, checks that its operations are this API key's, and journals the
// run's start (and the key's adoption, when SameAccount made one).
func (a *Agent) startRun() error {
	for _, rec := range a.j.recs {
		if err := a.v.apply(rec); err != nil {
			return err
		}
	}
	adopted, err := a.checkPrincipal()
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	if err := a.record(map[string]any{"type": RecRunStarted, "run_id": a.runID, "host": host, "pid": os.Getpid(),
		"command": a.cfg.Command, "principal": a.principal, "started_at": a.now()}); err != nil {
		return err
	}
	if adopted != nil {
		return a.record(adopted)
	}
	return nil
}

// Close ends the run and releases the journal.
func (a *Agent) Close() error { return a.j.close() }

// RunID is this run's id, sent as Agent-Run-Id.
func (a *Agent) RunID() string { return a.runID }

func (a *Agent) now() string { return auditchain.FormatTime(time.Now()) }

// record appends body to the journal (fsynced) and to the view.
func (a *Agent) record(body any) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec, err := a.j.append(body)
	if err != nil {
		return err
	}
	return a.v.apply(rec)
}

func (a *Agent) lockAction(actionID string) func() {
	a.mu.Lock()
	m := a.actions[actionID]
	if m == nil {
		m = &sync.Mutex{}
		a.actions[actionID] = m
	}
	a.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// Result is what a call ends with.
type Result struct {
	OperationID       string          `json:"operation_id"`
	ActionID          string          `json:"action_id"`
	Tool              string          `json:"tool"`
	State             string          `json:"state"`
	HTTPStatus        int             `json:"http_status,omitempty"`
	Code              string          `json:"code,omitempty"`
	ServerOperationID string          `json:"server_operation_id,omitempty"`
	IdempotencyKey    string          `json:"idempotency_key,omitempty"`
	Attempts          int             `json:"attempts"`
	NextStep          string          `json:"next_step"`
	Reason            string          `json:"reason,omitempty"`
	ApprovalID        string          `json:"approval_id,omitempty"`
	Evidence          []string        `json:"evidence,omitempty"`
	Body              json.RawMessage `json:"body,omitempty"`
}

// DoOptions are the rarer parts of a call.
type DoOptions struct {
	// Supersedes is the action id whose intent this new action replaces (a changed intent): the new operation
	// is sent with Supersedes-Operation-Id. While the old operation's outcome is unknown, the new one is not
	// sent: it stops needs_human (code superseded_operation_unknown), and goes once the old one settled or a
	// person approved it.
	Supersedes string
	// ParentRun is the agent run that delegated this action, journaled with its operation (1 to 128 printable
	// ASCII characters, an Agent-Run-Id): a worker's journal names the run that handed it the action.
	ParentRun string
	// Remediates is the service's id of an operation settled duplicate_effect_confirmed that this new refund
	// corrects (op_...): sent as Remediates-Operation-Id and journaled with the operation. refund_payment only.
	Remediates string
	// ParentOperation is, in a worker, the parent journal's operation id of the action it was handed (aop_...):
	// journaled with the worker's operation, whose attempts then name the worker's process; an attempt that may
	// have reached the service is not sent again by the worker (the parent owns retries, delegate.go). Not for
	// read-only tools: gathering facts is an intent of its own.
	ParentOperation string
	// DelegateTo is the journal of the worker this action is handed to: the operation is journaled here and
	// nothing is sent; the worker runs it, and Do again or Resume reads its state from that journal.
	DelegateTo string
}

// Do makes the write an action stands for, once. The first call for actionID creates the operation, its id
// and idempotency key, writes them to the journal and only then sends; a later call with the same action id
// continues that operation with the same key (or returns how it ended), and refuses with ErrChangedIntent,
// sending nothing, when args differ. It returns when the operation settled or the rule says to stop.
func (a *Agent) Do(ctx context.Context, actionID, toolName string, args json.RawMessage, opts DoOptions) (Result, error) {
	tool, ok := a.cfg.Tools.Tool(toolName)
	if !ok {
		return Result{}, fmt.Errorf("%w: unknown tool %q (one of %v)", ErrBadArguments, toolName, a.cfg.Tools.Names())
	}
	if err := a.checkCall(tool, actionID, args, opts); err != nil {
		return Result{}, err
	}
	req, err := a.prepareCall(tool, args)
	if err != nil {
		return Result{}, err
	}
	unlock := a.lockAction(actionID)
	defer unlock()

	a.mu.Lock()
	op := a.v.byAction[actionID]
	a.mu.Unlock()
	if op != nil {
		return a.continueOperation(ctx, op, tool, req, opts)
	}
	return a.startOperation(ctx, tool, actionID, req, opts)
}

// checkCall refuses a call whose action id, parent run, remediated operation, argument size or delegation is
// not one the agent can journal and send.
func (a *Agent) checkCall(tool Tool, actionID string, args json.RawMessage, opts DoOptions) error {
	if actionID == "" || len(actionID) > 200 {
		return fmt.Errorf("%w: an action id is 1 to 200 characters", ErrBadArguments)
	}
	if opts.ParentRun != "" && (len(opts.ParentRun) > 128 || !validID(opts.ParentRun)) {
		return fmt.Errorf("%w: a parent run is an agent run id: 1 to 128 printable ASCII characters, no spaces", ErrBadArguments)
	}
	if opts.Remediates != "" && (tool.Name != "refund_payment" || !validID(opts.Remediates) || !strings.HasPrefix(opts.Remediates, "op_")) {
		return fmt.Errorf("%w: remediates names the service's operation a refund corrects (op_...), and only refund_payment takes it",
			ErrBadArguments)
	}
	// A body the service would not take is never sent: it would fail every attempt before an answer.
	if len(args) > a.cfg.MaxBodyBytes {
		return fmt.Errorf("%w: the arguments are %d bytes; the agent sends at most %d (Config.MaxBodyBytes); nothing was sent",
			ErrBadArguments, len(args), a.cfg.MaxBodyBytes)
	}
	return checkDelegation(tool, opts)
}

// prepareCall checks args against tool and makes the request, refusing one the agent has nowhere to send or
// that is larger than the services take.
func (a *Agent) prepareCall(tool Tool, args json.RawMessage) (request, error) {
	req, err := tool.check(args)
	if err != nil {
		return request{}, err
	}
	if tool.Command != nil {
		if err := a.commandReady(tool); err != nil {
			return request{}, err
		}
	} else if !tool.ApprovalRequest && a.baseURL(tool.Service) == "" {
		svc, _ := a.cfg.Tools.Service(tool.Service)
		return request{}, fmt.Errorf("%w: service %s has no base URL: set %s; nothing was sent", ErrBadArguments, tool.Service, svc.BaseURLEnv)
	}
	if len(req.body) > a.cfg.MaxBodyBytes {
		return request{}, fmt.Errorf("%w: the request body is %d bytes; the agent sends at most %d (Config.MaxBodyBytes); nothing was sent",
			ErrBadArguments, len(req.body), a.cfg.MaxBodyBytes)
	}
	return req, nil
}

// startOperation journals a new action's operation and then hands it to a worker, holds it behind the
// operation it supersedes, or sends it.
func (a *Agent) startOperation(ctx context.Context, tool Tool, actionID string, req request, opts DoOptions) (Result, error) {
	op, err := a.createOperation(tool, actionID, req, opts)
	if err != nil {
		return Result{}, err
	}
	if op.Delegation != nil {
		return a.delegated(op), nil
	}
	if held, err := a.holdForSuperseded(op, req.approvalID); held || err != nil {
		return a.result(op), err
	}
	return a.drive(ctx, op, req.approvalID)
}

// continueOperation is a call again for op's action: refused when the intent changed, else op goes on from where
// it stands, with the call's approval or the last one given.
func (a *Agent) continueOperation(ctx context.Context, op *Operation, tool Tool, req request, opts DoOptions) (Result, error) {
	if err := a.checkSameIntent(op, tool, req, opts); err != nil {
		return a.result(op), err
	}
	if op.Final() {
		return a.continueSettled(ctx, op, req.approvalID)
	}
	approval := req.approvalID
	if approval == "" {
		approval = lastApproval(op)
	}
	return a.drive(ctx, op, approval)
}

// checkSameIntent refuses a call again for op's action with another tool or other arguments (journaling that
// it was refused), or with a supersedes or remediates the operation was not made with.
func (a *Agent) checkSameIntent(op *Operation, tool Tool, req request, opts DoOptions) error {
	if op.Tool != tool.Name || op.Fingerprint != req.fingerprint {
		_ = a.record(Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsChanged, RunID: a.runID, At: a.now(),
			Detail: fmt.Sprintf("called again as %s with arguments of fingerprint %s; nothing sent", tool.Name, req.fingerprint)})
		return fmt.Errorf("%w: action %q is operation %s (%s) with other arguments; nothing was sent. "+
			"To change the intent, use a new action id that supersedes %q", ErrChangedIntent, op.ActionID, op.OperationID, op.Tool, op.ActionID)
	}
	if opts.Supersedes != "" && opts.Supersedes != a.supersededAction(op) {
		return fmt.Errorf("%w: action %q already exists; supersedes applies to a new action only", ErrBadArguments, op.ActionID)
	}
	if opts.Remediates != "" && opts.Remediates != op.RemediatesServerOpID {
		return fmt.Errorf("%w: action %q already exists without remediating %s; remediates applies to a new action only",
			ErrBadArguments, op.ActionID, opts.Remediates)
	}
	return nil
}

// continueSettled returns how a settled op ended, unless a call may move it on: a replacement held back whose
// superseded operation settled since, or a needs_human operation with a new approval.
func (a *Agent) continueSettled(ctx context.Context, op *Operation, approvalID string) (Result, error) {
	if heldBack(op) && approvalID == "" {
		return a.releaseHeld(ctx, op)
	}
	if op.Settled.State == StateNeedsHuman && approvalID != "" && approvalID != lastApproval(op) {
		if err := a.record(Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsApproval, RunID: a.runID,
			ApprovalID: approvalID, At: a.now(), Detail: "approval " + approvalID + " given; the budget starts again"}); err != nil {
			return Result{}, err
		}
		return a.drive(ctx, op, approvalID)
	}
	if given, err := a.grantGiven(op); given || err != nil {
		if err != nil {
			return Result{}, err
		}
		return a.drive(ctx, op, "")
	}
	return a.result(op), nil
}

// releaseHeld sends op, held back by holdForSuperseded, once the operation it supersedes is no longer of unknown
// outcome (journaling so); otherwise it stays held.
func (a *Agent) releaseHeld(ctx context.Context, op *Operation) (Result, error) {
	a.mu.Lock()
	ob := Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsSupersededSettled, RunID: a.runID}
	old := a.v.ops[op.SupersedesOperationID]
	unknown := old == nil || outcomeUnknown(old) != ""
	if !unknown {
		ob.SupersededServerOpID = old.ServerOperationID()
		ob.Detail = fmt.Sprintf("action %s, which this one supersedes, is no longer of unknown outcome (%s); this one may be sent",
			old.ActionID, old.State())
	}
	a.mu.Unlock()
	if unknown {
		return a.result(op), nil
	}
	ob.At = a.now()
	if err := a.record(ob); err != nil {
		return Result{}, err
	}
	return a.drive(ctx, op, "")
}

// holdForSuperseded stops op, new and not yet sent, with needs_human when the operation it supersedes may or may
// not have happened: the replacement could add a second effect to it. It goes later, once the old one settled
// (Do again), or with a person's approval of this exact request (Do again with approval_id), which the service
// also asks for before it lets a write supersede an operation it holds as unknown.
func (a *Agent) holdForSuperseded(op *Operation, approvalID string) (bool, error) {
	if op.SupersedesOperationID == "" || approvalID != "" {
		return false, nil
	}
	a.mu.Lock()
	old := a.v.ops[op.SupersedesOperationID]
	why := outcomeUnknown(old)
	card := ""
	if why != "" {
		card = priorCard(old, why)
	}
	a.mu.Unlock()
	if why == "" {
		return false, nil
	}
	next := fmt.Sprintf("nothing sent: action %q (operation %s), which this one supersedes, may or may not have happened, "+
		"so a replacement could add to it. Settle it first: call %q again with its own arguments, or run resume, until it "+
		"succeeds, fails or a person records what happened; then call %q again", old.ActionID, old.OperationID, old.ActionID, op.ActionID)
	if a.takesApproval(op.Tool) {
		next += fmt.Sprintf(". To replace it anyway, a person decides: call request_approval with {\"for_action\": %q} (the "+
			"approval names the operation it replaces, and the approver is shown it), have a person approve it, then call %s "+
			"again with the same action_id and arguments plus approval_id", op.ActionID, op.Tool)
	}
	return true, a.settle(op, step{state: StateNeedsHuman, code: CodeSupersededUnknown,
		why: "supersedes an operation whose outcome is unknown: " + card, next: next})
}

// priorCard says what a person deciding on a replacement must know of the operation it replaces, old, whose
// outcome is unknown for reason why: its operation, its last dispatch state and why it is unknown. The caller
// holds a.mu.
func priorCard(old *Operation, why string) string {
	server := old.ServerOperationID()
	if server == "" {
		server = "none known"
	}
	dispatch := "none"
	if last := lastAttempt(old); last != nil {
		dispatch = "started, no end recorded"
		if r := last.Finished; r != nil {
			dispatch = r.DispatchState
			if r.Error != "" {
				dispatch += " (" + r.Error + ")"
			}
		}
	}
	return fmt.Sprintf("prior operation %s (action %q, service operation %s); its last dispatch: %s; reason: %s",
		old.OperationID, old.ActionID, server, dispatch, why)
}

// CodeSupersededUnknown is the code of a result held back because the operation it supersedes may or may not
// have happened; the services answer a write that tries it with the same code (409).
const CodeSupersededUnknown = "superseded_operation_unknown"

// heldBack reports whether op was stopped by holdForSuperseded and has not been sent since.
func heldBack(op *Operation) bool {
	return op.Settled != nil && op.Settled.State == StateNeedsHuman && op.Settled.Code == CodeSupersededUnknown &&
		len(op.Attempts) == 0 && op.SupersedesOperationID != ""
}

// outcomeUnknown says why op may or may not have had its effect, as far as the agent knows, or "" when its
// outcome is known (or nothing of it was ever sent): the service last called it unknown, or its last attempt
// may have reached the service and nothing said how it ended since. The caller holds a.mu.
func outcomeUnknown(op *Operation) string {
	switch op.State() {
	case StateSucceeded, StateFailed, StateRefused:
		return ""
	case StateUnknown:
		return "the service holds it as unknown"
	}
	last := lastAttempt(op)
	if last == nil {
		return ""
	}
	switch st := lastServerState(op); st {
	case "unknown":
		return "the service holds it as unknown"
	case "succeeded", "failed", "cancelled":
		return ""
	}
	if last.Finished == nil || last.Finished.DispatchState == SentNoResponse || last.Finished.DispatchState == ExecutionError {
		return "its last attempt may have reached the service and no answer says how it ended"
	}
	return ""
}

func (a *Agent) supersededAction(op *Operation) string {
	if op.SupersedesOperationID == "" {
		return ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if old := a.v.ops[op.SupersedesOperationID]; old != nil {
		return old.ActionID
	}
	return ""
}

// lastApproval is the newest approval id a person gave for op.
func lastApproval(op *Operation) string {
	id, at := "", ""
	for _, a := range op.Attempts {
		if a.ApprovalID != "" {
			id, at = a.ApprovalID, a.At
		}
	}
	for _, o := range op.Observations {
		if o.Kind == ObsApproval && o.At >= at {
			id, at = o.ApprovalID, o.At
		}
	}
	return id
}

// createOperation writes the operation, with its id and idempotency key, before anything is sent.
func (a *Agent) createOperation(tool Tool, actionID string, req request, opts DoOptions) (*Operation, error) {
	op := &Operation{
		Type: RecOperationCreated, OperationID: ids.New("aop_"), ActionID: actionID, Tool: tool.Name,
		Service: tool.Service, Method: tool.Method, RouteTemplate: tool.Route, Path: req.path, Args: req.args,
		Fingerprint: req.fingerprint, RetryMode: tool.Mode, Budget: a.cfg.Budget, AuthorityRef: a.cfg.AuthorityRef,
		Principal: &a.principal, RunID: a.runID, At: a.now(), ParentRunID: opts.ParentRun, RemediatesServerOpID: opts.Remediates,
		ParentOperationID: opts.ParentOperation,
	}
	if opts.DelegateTo != "" {
		// Absolute, so that a resume from another directory reads the same worker.
		path, err := filepath.Abs(opts.DelegateTo)
		if err != nil {
			return nil, fmt.Errorf("%w: worker journal: %v", ErrBadArguments, err)
		}
		op.Delegation = &Delegation{WorkerJournal: path}
	}
	if tool.Keyed {
		op.IdempotencyKey, op.KeyNamespace = derivedKey(a.cfg.NamespaceSecret, a.cfg.Namespace, actionID), a.cfg.Namespace
		op.KeySecretRef = a.cfg.NamespaceSecretRef
	}
	if tool.Command != nil {
		a.commandOperation(op, tool, req)
	}
	if tool.ApprovalRequest {
		if err := a.approvalTarget(op, req); err != nil {
			return nil, err
		}
	}
	if opts.Supersedes != "" {
		if err := a.supersede(op, opts.Supersedes); err != nil {
			return nil, err
		}
	}
	a.cfg.Hook("before_journal")
	if err := a.record(op); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.v.ops[op.OperationID], nil
}

// approvalTarget sends a request_approval operation to the service of the action it asks about (for_action),
// which must be a keyed action of a service that takes approvals.
func (a *Agent) approvalTarget(op *Operation, req request) error {
	var f struct {
		ForAction string `json:"for_action"`
	}
	_ = json.Unmarshal(req.args, &f)
	a.mu.Lock()
	target := a.v.byAction[f.ForAction]
	a.mu.Unlock()
	if target == nil {
		return fmt.Errorf("%w: for_action %q is not in the journal", ErrUnknownAction, f.ForAction)
	}
	if svc, _ := a.cfg.Tools.Service(target.Service); target.IdempotencyKey == "" || !svc.Approvals {
		return fmt.Errorf("%w: %s (%s) does not take approvals", ErrBadArguments, f.ForAction, target.Tool)
	}
	op.Service = target.Service
	return nil
}

// supersede names in op the operation of the action it replaces, and the service's id for it.
func (a *Agent) supersede(op *Operation, actionID string) error {
	a.mu.Lock()
	old := a.v.byAction[actionID]
	a.mu.Unlock()
	if old == nil {
		return fmt.Errorf("%w: supersedes %q: no such action in the journal", ErrUnknownAction, actionID)
	}
	op.SupersedesOperationID = old.OperationID
	op.SupersedesServerOpID = old.ServerOperationID()
	if !httpguts.ValidHeaderFieldValue(op.SupersedesServerOpID) {
		return fmt.Errorf("%w: supersedes %q: the service named that operation with characters a header cannot carry",
			ErrBadArguments, actionID)
	}
	return nil
}

// Resume drives every operation the journal has not finished to an end, from evidence: it looks each one up,
// then retries with the same key or hands it to a person. It never makes a new key for an operation.
func (a *Agent) Resume(ctx context.Context) ([]Result, error) {
	a.mu.Lock()
	var open []*Operation
	for _, op := range a.v.order {
		if !op.Final() {
			open = append(open, op)
		}
	}
	a.mu.Unlock()
	var out []Result
	for _, op := range open {
		unlock := a.lockAction(op.ActionID)
		res, err := a.drive(ctx, op, lastApproval(op))
		unlock()
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// Operation returns the journal's operation for an action id, or for an operation id.
func (a *Agent) Operation(id string) (*Operation, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if op := a.v.byAction[id]; op != nil {
		return op, true
	}
	op, ok := a.v.ops[id]
	return op, ok
}

// Operations are the journal's operations in creation order.
func (a *Agent) Operations() []*Operation {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*Operation(nil), a.v.order...)
}

// Result is how op stands now.
func (a *Agent) Result(op *Operation) Result { return a.result(op) }

func (a *Agent) result(op *Operation) Result {
	a.mu.Lock()
	defer a.mu.Unlock()
	return resultOf(op)
}

// resultOf is how op stands; the caller keeps op from changing meanwhile.
func resultOf(op *Operation) Result {
	r := Result{OperationID: op.OperationID, ActionID: op.ActionID, Tool: op.Tool, IdempotencyKey: op.IdempotencyKey,
		Attempts: len(op.Attempts), ServerOperationID: op.ServerOperationID(), State: StateOpen,
		NextStep: "not settled yet: call again with the same action_id, or run resume"}
	if s := op.Settled; s != nil {
		r.State, r.HTTPStatus, r.Code, r.NextStep, r.Reason = s.State, s.HTTPStatus, s.Code, s.NextStep, s.Reason
		r.Body, r.Evidence, r.ApprovalID = s.Body, s.Evidence, s.ApprovalID
		if s.ServerOperationID != "" {
			r.ServerOperationID = s.ServerOperationID
		}
	}
	return r
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
