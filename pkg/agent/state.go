package agent

import (
	"encoding/json"
	"fmt"
)

// States an operation ends in, and the two it passes through.
const (
	StateOpen       = "open"        // created, not settled: resume drives it
	StateInProgress = "in_progress" // the service accepted it and is still working (a deploy): resume keeps asking
	// StateUnknown: the service itself holds the operation as unknown (a 202 naming it unknown, a 503
	// outcome_unknown): it may or may not have happened, and the service is reconciling it. Resume keeps asking;
	// only the same key, or a person, ever settles it.
	StateUnknown    = "unknown"
	StateSucceeded  = "succeeded"
	StateFailed     = "failed"      // the service says it did not happen
	StateRefused    = "refused"     // the service refused it (4xx), or the agent refused a changed intent
	StateNeedsHuman = "needs_human" // an approval, an exhausted budget, or evidence the rule cannot read
)

// Dispatch states of an attempt (seed 004): what the caller saw, not what it hopes.
const (
	NotSent          = "not_sent"
	SentNoResponse   = "sent_no_response"
	ResponseReceived = "response_received"
	ExecutionError   = "execution_error"
)

// Operation is one intended effect: its identity, written before the first send, and its evidence.
type Operation struct {
	Type                  string          `json:"type"`
	OperationID           string          `json:"operation_id"`
	ActionID              string          `json:"action_id"`
	IdempotencyKey        string          `json:"idempotency_key,omitempty"`
	Tool                  string          `json:"tool"`
	Service               string          `json:"service"`
	Method                string          `json:"method"`
	RouteTemplate         string          `json:"route_template"`
	Path                  string          `json:"path"`
	Args                  json.RawMessage `json:"args"`
	Fingerprint           string          `json:"fingerprint"`
	RetryMode             RetryMode       `json:"retry_mode"`
	Budget                int             `json:"budget"`
	SupersedesOperationID string          `json:"supersedes_operation_id,omitempty"`
	SupersedesServerOpID  string          `json:"supersedes_server_operation_id,omitempty"`
	// RemediatesServerOpID is the service's operation (duplicate_effect_confirmed) this refund corrects, sent
	// as Remediates-Operation-Id (agent do --remediates).
	RemediatesServerOpID string `json:"remediates_server_operation_id,omitempty"`
	// KeyNamespace is what IdempotencyKey was derived from, with the action id (absent when the key was made
	// at random, in journals from before keys were derived).
	KeyNamespace string `json:"key_namespace,omitempty"`
	// KeySecretRef names the secret the key was derived under (never the secret; absent for keys derived
	// without one, in journals from before keys had a secret).
	KeySecretRef string `json:"key_secret_ref,omitempty"`
	// ParentRunID is the agent run that delegated this action (agent do --parent-run).
	ParentRunID string `json:"parent_run_id,omitempty"`
	// ParentOperationID is, in a worker's journal, the parent's operation this one carries out (delegate.go).
	ParentOperationID string `json:"parent_operation_id,omitempty"`
	// Delegation is, in a parent's journal, the worker the operation was handed to; the parent sends nothing.
	Delegation *Delegation `json:"delegation,omitempty"`
	// AuthorityRef names where the credential came from, never the credential.
	AuthorityRef string `json:"authority_ref"`
	// Principal is the key the operation was made with (absent in journals from before keys were recorded).
	Principal *Principal `json:"principal,omitempty"`
	RunID     string     `json:"run_id"`
	At        string     `json:"at"`
	// Command is a command tool's intent (command.go).
	Command *CommandIntent `json:"command,omitempty"`

	Attempts     []*Attempt     `json:"-"`
	Observations []*Observation `json:"-"`
	Settled      *Settlement    `json:"-"`
	// budgetFrom is how many attempts came before the last decision of a person (an approval id given):
	// the budget counts attempts after it.
	budgetFrom int
}

// Attempt is one HTTP send of an operation.
type Attempt struct {
	Type        string `json:"type"`
	OperationID string `json:"operation_id"`
	AttemptID   string `json:"attempt_id"`
	Number      int    `json:"number"`
	RetryOf     string `json:"retry_of,omitempty"`
	// RetryOfSent is the Retry-Of header actually sent: the nearest earlier attempt the server has seen (it refuses
	// lineage to an attempt it never received).
	RetryOfSent string `json:"retry_of_sent,omitempty"`
	RetryReason string `json:"retry_reason,omitempty"`
	// RetryReasonSent is the Retry-Reason header actually sent, when it differs from RetryReason: the nearest
	// reason on the services' fixed list (absent: RetryReason was sent).
	RetryReasonSent string `json:"retry_reason_sent,omitempty"`
	Decision        string `json:"decision"`
	BudgetLeft      int    `json:"budget_left"`
	ApprovalID      string `json:"approval_id,omitempty"`
	// GrantID is the grant the attempt was sent under (Grant-Id), journaled before it was sent.
	GrantID string `json:"grant_id,omitempty"`
	RunID   string `json:"run_id"`
	At      string `json:"at"`
	// Command is where a command attempt connected, and the host key it checked.
	Command *CommandAttempt `json:"command,omitempty"`
	// Process is the worker process that made the attempt, in a worker's journal.
	Process *Process `json:"process,omitempty"`
	// TraceParent is the W3C traceparent the attempt sent, when tracing is on (pkg/tracing): its trace id is the
	// action's trace, which every later attempt, in any process, joins.
	TraceParent string `json:"traceparent,omitempty"`

	Finished *AttemptResult `json:"-"`
}

// AttemptResult is how an attempt ended.
type AttemptResult struct {
	Type              string `json:"type"`
	OperationID       string `json:"operation_id"`
	AttemptID         string `json:"attempt_id"`
	DispatchState     string `json:"dispatch_state"`
	Status            int    `json:"status,omitempty"`
	Code              string `json:"code,omitempty"`
	ServerOperationID string `json:"server_operation_id,omitempty"`
	ServerState       string `json:"server_state,omitempty"`
	Replayed          bool   `json:"replayed,omitempty"`
	RetryAfterSeconds int    `json:"retry_after_s,omitempty"`
	// KeyExpiresAt is when the service said it forgets the idempotency key (its key_expires_at), as it wrote it.
	KeyExpiresAt string          `json:"key_expires_at,omitempty"`
	Error        string          `json:"error,omitempty"`
	Body         json.RawMessage `json:"body,omitempty"`
	DurationMS   int64           `json:"duration_ms"`
	At           string          `json:"at"`
	// Command is a command attempt's boundary and exit code.
	Command *CommandResult `json:"command,omitempty"`
}

// Observation is evidence gathered without sending the write again: an operation lookup or poll (negative ones
// too), an attempt found interrupted by a crash, a refused changed intent.
type Observation struct {
	Type              string   `json:"type"`
	OperationID       string   `json:"operation_id"`
	Kind              string   `json:"kind"`
	Endpoint          string   `json:"endpoint,omitempty"`
	Status            int      `json:"status,omitempty"`
	Found             *bool    `json:"found,omitempty"`
	ServerOperationID string   `json:"server_operation_id,omitempty"`
	ServerState       string   `json:"server_state,omitempty"`
	KnownAttempts     []string `json:"known_attempts,omitempty"`
	KeyExpiresAt      string   `json:"key_expires_at,omitempty"`
	// SupersededServerOpID is, for superseded_settled, the service's id of the operation superseded.
	SupersededServerOpID string `json:"superseded_server_operation_id,omitempty"`
	AttemptID            string `json:"attempt_id,omitempty"`
	ApprovalID           string `json:"approval_id,omitempty"`
	// Budget is, for retry_requested, the attempts the operation may make from then on.
	Budget int `json:"budget,omitempty"`
	// DecidedBy and RemoteRef are, for operator_decision, who decided and the other side's record they cite;
	// its Detail is their evidence.
	DecidedBy  string `json:"decided_by,omitempty"`
	RemoteRef  string `json:"remote_ref,omitempty"`
	Detail     string `json:"detail,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	// LostServerOpID is, for operation_lost, the service's operation it acknowledged and no longer has.
	LostServerOpID string `json:"lost_server_operation_id,omitempty"`
	// Path is, for operation_lost and dependency_remade, the path the operation is sent to from then on: its
	// own, or with a resource it names replaced by the one made again in its place (lost.go).
	Path  string `json:"path,omitempty"`
	RunID string `json:"run_id"`
	At    string `json:"at"`
	// Command is a command_check's boundary and exit code.
	Command *CommandResult `json:"command,omitempty"`
}

// Observation kinds.
const (
	ObsLookup      = "operation_lookup"    // GET /v1/operations?idempotency_key=
	ObsPoll        = "operation_poll"      // GET /v1/operations/{id}
	ObsInterrupted = "attempt_interrupted" // an attempt started by a process that died before recording its end
	ObsChanged     = "changed_intent_refused"
	ObsApproval    = "approval_given" // a person's approval id arrived with a call
	// ObsSupersededSettled: the operation this one supersedes, whose unknown outcome held this one back, has
	// settled; this one may be sent.
	ObsSupersededSettled = "superseded_settled"
)

// Settlement is how an operation ended (or, for in_progress and unknown, where it stands when the agent stopped
// waiting).
type Settlement struct {
	Type              string          `json:"type"`
	OperationID       string          `json:"operation_id"`
	State             string          `json:"state"`
	Reason            string          `json:"reason"`
	NextStep          string          `json:"next_step"`
	HTTPStatus        int             `json:"http_status,omitempty"`
	Code              string          `json:"code,omitempty"`
	ServerOperationID string          `json:"server_operation_id,omitempty"`
	ApprovalID        string          `json:"approval_id,omitempty"`
	Body              json.RawMessage `json:"body,omitempty"`
	Evidence          []string        `json:"evidence,omitempty"`
	RunID             string          `json:"run_id"`
	At                string          `json:"at"`
}

// Final reports whether the operation reached an end that resume leaves alone.
func (o *Operation) Final() bool {
	return o.Settled != nil && o.Settled.State != StateInProgress && o.Settled.State != StateUnknown && o.Settled.State != StateUnresolved
}

// ServerOperationID is the service's operation id, from the last answer or observation that named it.
func (o *Operation) ServerOperationID() string {
	id := ""
	for _, a := range o.Attempts {
		if a.Finished != nil && a.Finished.ServerOperationID != "" {
			id = a.Finished.ServerOperationID
		}
	}
	for _, ob := range o.Observations {
		if ob.ServerOperationID != "" && id == "" {
			id = ob.ServerOperationID
		}
	}
	return id
}

// budgetLeft is how many more attempts the budget allows.
func (o *Operation) budgetLeft() int {
	return o.Budget - (len(o.Attempts) - o.budgetFrom)
}

// view is the journal read into operations.
type view struct {
	runs     int
	ops      map[string]*Operation
	order    []*Operation
	byAction map[string]*Operation
	attempts map[string]*Attempt
	// principal is the key the journal acts for: the one its operations were made with, or the one an
	// operator adopted since. unrecorded counts operations journaled without their key since then.
	principal  *Principal
	unrecorded int
}

func newView() *view {
	return &view{ops: map[string]*Operation{}, byAction: map[string]*Operation{}, attempts: map[string]*Attempt{}}
}

// apply adds one record body to the view.
func (v *view) apply(body json.RawMessage) error {
	var head struct {
		Type        string `json:"type"`
		OperationID string `json:"operation_id"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return fmt.Errorf("agent: journal record: %w", err)
	}
	var op *Operation
	if head.OperationID != "" && head.Type != RecOperationCreated {
		op = v.ops[head.OperationID]
		if op == nil {
			return fmt.Errorf("agent: journal record %s names unknown operation %s", head.Type, head.OperationID)
		}
	}
	if applyRecord := recordAppliers[head.Type]; applyRecord != nil {
		return applyRecord(v, op, body)
	}
	return nil
}

// recordAppliers say how each type of record changes the view, given the operation the record names (nil for
// records of the whole journal); records of other types leave it as it is.
var recordAppliers = map[string]func(v *view, op *Operation, body json.RawMessage) error{
	RecRunStarted:       (*view).startRun,
	RecOperationCreated: (*view).createOperation,
	RecPrincipalAdopted: (*view).adoptPrincipal,
	RecAttemptStarted:   (*view).startAttempt,
	RecAttemptFinished:  (*view).finishAttempt,
	RecObservation:      (*view).observe,
	RecOperationSettled: (*view).settle,
}

func (v *view) startRun(*Operation, json.RawMessage) error {
	v.runs++
	return nil
}

// createOperation adds the operation, and counts the key it was made with as the journal's.
func (v *view) createOperation(_ *Operation, body json.RawMessage) error {
	o := &Operation{}
	if err := json.Unmarshal(body, o); err != nil {
		return err
	}
	v.ops[o.OperationID] = o
	v.order = append(v.order, o)
	v.byAction[o.ActionID] = o
	if o.Principal != nil {
		v.principal = o.Principal
	} else {
		v.unrecorded++
	}
	return nil
}

func (v *view) adoptPrincipal(_ *Operation, body json.RawMessage) error {
	p := &principalAdopted{}
	if err := json.Unmarshal(body, p); err != nil {
		return err
	}
	v.principal, v.unrecorded = &p.Principal, 0
	return nil
}

func (v *view) startAttempt(op *Operation, body json.RawMessage) error {
	a := &Attempt{}
	if err := json.Unmarshal(body, a); err != nil {
		return err
	}
	op.Attempts = append(op.Attempts, a)
	v.attempts[a.AttemptID] = a
	return nil
}

// finishAttempt records how an attempt ended; an end whose attempt the journal does not hold is ignored.
func (v *view) finishAttempt(_ *Operation, body json.RawMessage) error {
	r := &AttemptResult{}
	if err := json.Unmarshal(body, r); err != nil {
		return err
	}
	if a := v.attempts[r.AttemptID]; a != nil {
		a.Finished = r
	}
	return nil
}

func (v *view) observe(op *Operation, body json.RawMessage) error {
	ob := &Observation{}
	if err := json.Unmarshal(body, ob); err != nil {
		return err
	}
	op.Observations = append(op.Observations, ob)
	op.reopenAfter(ob)
	return nil
}

// reopenAfter opens the operation again when the observation is someone's word that it may go on.
func (o *Operation) reopenAfter(ob *Observation) {
	switch ob.Kind {
	case ObsApproval, ObsGrant:
		// A person decided: the operation is open again, with a fresh budget.
		o.budgetFrom = len(o.Attempts)
		o.Settled = nil
	case ObsRetryRequested:
		// Someone asked for a retry with the same key: open again, with the budget they gave.
		o.budgetFrom, o.Budget, o.Settled = len(o.Attempts), ob.Budget, nil
	case ObsLost, ObsDependencyRemade:
		// The service no longer has what it acknowledged: open again, to be sent again under the same key.
		o.budgetFrom, o.Settled = len(o.Attempts), nil
		if ob.Path != "" {
			o.Path = ob.Path
		}
	case ObsSupersededSettled:
		o.Settled = nil
		if o.SupersedesServerOpID == "" {
			o.SupersedesServerOpID = ob.SupersededServerOpID
		}
	}
}

func (v *view) settle(op *Operation, body json.RawMessage) error {
	s := &Settlement{}
	if err := json.Unmarshal(body, s); err != nil {
		return err
	}
	op.Settled = s
	return nil
}
