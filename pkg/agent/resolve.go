package agent

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

// ObsOperatorDecision is the observation of a person's decision on a needs_human action (Agent.Resolve): what
// they learned elsewhere, who they are, and the state they decided.
const ObsOperatorDecision = "operator_decision"

// MaxEvidence is the most characters a decision's evidence may hold, as on the services.
const MaxEvidence = 2000

// ErrNotNeedsHuman is returned by Resolve for an action that does not wait for a person.
var ErrNotNeedsHuman = errors.New("agent: the action does not wait for a person")

// Decision is what a person decided about a needs_human action.
type Decision struct {
	// State is StateSucceeded or StateFailed.
	State string
	// Evidence is what the decision rests on (several lines allowed).
	Evidence string
	// RemoteRef names the other side's record of the effect, when there is one.
	RemoteRef string
	// By names the person.
	By string
}

// Validate holds d to the services' input rules for a decision (By may still be empty: Resolve needs it).
func (d Decision) Validate() error {
	if d.State != StateSucceeded && d.State != StateFailed {
		return fmt.Errorf("agent: a decision's state is succeeded or failed, not %q", d.State)
	}
	for _, f := range []struct {
		name, value string
		max         int
		multiline   bool
	}{{"evidence", d.Evidence, MaxEvidence, true}, {"remote_ref", d.RemoteRef, 255, false}, {"by", d.By, 255, false}} {
		if fault := problem.TextFault(f.value, f.multiline); fault != "" {
			return fmt.Errorf("agent: a decision's %s %s", f.name, fault)
		}
		if utf8.RuneCountInString(f.value) > f.max {
			return fmt.Errorf("agent: a decision's %s is longer than %d characters", f.name, f.max)
		}
	}
	if d.Evidence == "" {
		return errors.New("agent: a decision needs its evidence")
	}
	return nil
}

// Resolve records d for the needs_human action (or operation) id: an operator_decision observation with the
// evidence and who decided, then the settlement in d.State, both in the journal's hash chain, so show and
// audit verify --journal tell how the action ended. It sends nothing: a decision that the service's
// operation must record too goes to POST /v1/operations/{id}/resolution (its server operation id is in the
// result). Returns ErrNotNeedsHuman, naming the state, for an action in any other state.
func (a *Agent) Resolve(id string, d Decision) (Result, error) {
	if err := d.Validate(); err != nil {
		return Result{}, err
	}
	if d.By == "" {
		return Result{}, errors.New("agent: a decision needs who decided")
	}
	op, ok := a.Operation(id)
	if !ok {
		return Result{}, fmt.Errorf("agent: no operation or action %q in the journal", id)
	}
	unlock := a.lockAction(op.ActionID)
	defer unlock()
	if st := a.stateOf(op); st != StateNeedsHuman && st != StateUnresolved {
		return Result{}, fmt.Errorf("%w: action %q is %s", ErrNotNeedsHuman, op.ActionID, st)
	}
	server := a.serverOperationID(op)
	if err := a.record(&Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsOperatorDecision,
		ServerOperationID: server, ServerState: d.State, DecidedBy: d.By, RemoteRef: d.RemoteRef, Detail: d.Evidence,
		RunID: a.runID, At: a.now()}); err != nil {
		return Result{}, err
	}
	next := "none: a person decided it"
	if server != "" {
		next = "record the decision on the service too: POST /v1/operations/" + server + "/resolution (an approver key)"
	}
	if err := a.record(&Settlement{Type: RecOperationSettled, OperationID: op.OperationID, State: d.State,
		Reason: "decided by " + d.By, NextStep: next, ServerOperationID: server, Evidence: []string{d.Evidence},
		RunID: a.runID, At: a.now()}); err != nil {
		return Result{}, err
	}
	return a.result(op), nil
}

func (a *Agent) stateOf(op *Operation) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return op.State()
}

func (a *Agent) serverOperationID(op *Operation) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if op.Settled != nil && op.Settled.ServerOperationID != "" {
		return op.Settled.ServerOperationID
	}
	return op.ServerOperationID()
}
