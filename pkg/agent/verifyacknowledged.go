package agent

import "context"

// What Verify found of an action, in Check.Record.
const (
	// RecordPresent: the service has the operation it acknowledged.
	RecordPresent = "present"
	// RecordLost: the service answers 404 for the operation it acknowledged; it was sent again under its key.
	RecordLost = "lost"
	// RecordUnchecked: the service could not be asked (unreachable, 5xx, no operations route); nothing was sent.
	RecordUnchecked = "unchecked"
	// RecordDependencyLost: the action was refused 404 for a resource an earlier action made, which the service
	// lost; it was sent again under its key to the resource made again.
	RecordDependencyLost = "dependency_lost"
)

// Check is what Verify found of one action the journal holds as done, and what it did about it.
type Check struct {
	ActionID    string `json:"action_id"`
	OperationID string `json:"operation_id"`
	Tool        string `json:"tool"`
	// Record is what the service has of it: present, lost, unchecked or dependency_lost.
	Record string `json:"service_record"`
	// LostServerOperationID is the service's operation it acknowledged and no longer has.
	LostServerOperationID string `json:"lost_server_operation_id,omitempty"`
	// Remade reports that the action was sent again under its key and succeeded.
	Remade bool `json:"remade"`
	// Result is how the action stands after it was sent again.
	Result *Result `json:"result,omitempty"`
}

// Verify asks the services, in journal order, for every operation the journal says they acknowledged (a keyed
// request settled succeeded: GET the operation by the id its answer named, on the tools file's operations
// route) and sends again, under its own key and with its own body, each one the service answers 404 for:
// journaled operation_lost, then the attempts, then how it settled. An action later in the journal whose path
// names a resource made again goes to the new one, and one refused 404 because such a resource was lost goes
// again too (dependency_lost). Run it after a database failover that may have lost acknowledged writes (an
// asynchronous standby promoted): the services make each action once again, and a payment provider replays
// its calls. Nothing else is sent: not a command, not an action of another journal, not one the service never
// acknowledged. The checks are in journal order; an action refused 404 whose resources are all there is left
// out.
func (a *Agent) Verify(ctx context.Context) ([]Check, error) {
	a.mu.Lock()
	var todo []*Operation
	for _, op := range a.v.order {
		if a.acknowledged(op) || refusedNotFound(op) {
			todo = append(todo, op)
		}
	}
	a.mu.Unlock()
	var out []Check
	for _, op := range todo {
		c, err := a.verifyOne(ctx, op)
		if err != nil {
			return out, err
		}
		if c.Record != "" {
			out = append(out, c)
		}
	}
	return out, nil
}

// verifyOne checks one operation and makes it again when the service lost it (or, for one refused 404, what
// its path names); a Check without a Record means there was nothing to say.
func (a *Agent) verifyOne(ctx context.Context, op *Operation) (Check, error) {
	unlock := a.lockAction(op.ActionID)
	defer unlock()
	c := Check{ActionID: op.ActionID, OperationID: op.OperationID, Tool: op.Tool}
	if a.stateOf(op) == StateRefused {
		again, err := a.remakeDependencies(ctx, op)
		if err != nil || !again {
			return Check{}, err
		}
		c.Record = RecordDependencyLost
		res, err := a.drive(ctx, op, lastApproval(op))
		return c.after(res), err
	}
	found, err := a.stillThere(ctx, op)
	switch {
	case err != nil:
		return c, err
	case found == nil:
		c.Record = RecordUnchecked
		return c, nil
	case *found:
		c.Record = RecordPresent
		return c, nil
	}
	c.Record, c.LostServerOperationID = RecordLost, a.serverOperationID(op)
	res, err := a.remake(ctx, op)
	return c.after(res), err
}

// after is c with the result of sending the action again.
func (c Check) after(res Result) Check {
	c.Result, c.Remade = &res, res.State == StateSucceeded
	return c
}
