package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// What the agent does when a service no longer has what it acknowledged. A database that fails over to an
// asynchronous standby loses its newest commits: an intent created and acknowledged 201 can be gone, with its
// operation and its key, while the payment provider keeps the authorization. The journal still says succeeded.
// Sent again under the same Idempotency-Key with the same body, the action is made once more at the service
// and the provider replays its first call (its key comes from the account and the Idempotency-Key), so it
// exists exactly once again. An action whose path names the lost resource (a capture of the lost intent) then
// goes to the resource made again in its place.
//
// The journal links the two: the resource an earlier action made is the id its successful answer named
// (madeIDs), and a later action depends on it when a segment of its path is that id (makersOf). Only keyed
// requests the service acknowledged are sent again (acknowledged): never a command, whose key the host may
// not dedupe, nor an action handed to a worker or carried out for a parent, whose retries are not this
// journal's alone.

// Observation kinds of operations sent again because the service lost what it had acknowledged.
const (
	// ObsLost: the service answers 404 for an operation it acknowledged; the operation opens again with a
	// fresh budget and is sent again under its key.
	ObsLost = "operation_lost"
	// ObsDependencyRemade: a resource the operation's path names was lost with the action that made it and
	// made again; the operation opens again and is sent under its key to the path of the resource made again.
	ObsDependencyRemade = "dependency_remade"
)

// ReasonAcknowledgedLost is the retry reason of a send made because the service lost the operation (or the
// resource) it had acknowledged; the services do not list it, so Retry-Reason carries
// response_lost_after_dispatch, the agent no longer trusting an answer it had.
const ReasonAcknowledgedLost = "acknowledged_lost"

// remakeStep is the send an operation gets when it was found lost, or a resource of its path made again, since
// its last attempt ended: again under its key.
func remakeStep(op *Operation, last *Attempt) (step, bool) {
	if last.Finished == nil {
		return step{}, false
	}
	for _, o := range op.Observations {
		if o.At < last.Finished.At {
			continue
		}
		switch o.Kind {
		case ObsLost:
			return step{kind: "send", reason: ReasonAcknowledgedLost, decision: "lost_send_again_same_key"}, true
		case ObsDependencyRemade:
			return step{kind: "send", reason: ReasonAcknowledgedLost, decision: "dependency_remade_send_again_same_key"}, true
		}
	}
	return step{}, false
}

// resendable reports whether op is a keyed request this journal alone decides to send again: not a command,
// not an action handed to a worker, not one carried out for a parent journal.
func resendable(op *Operation) bool {
	return op.IdempotencyKey != "" && op.Command == nil && op.Delegation == nil && op.ParentOperationID == ""
}

// acknowledged reports whether the journal shows that the service made op: settled succeeded on a successful
// answer, or on the service's record of it found succeeded; resendable, and not an approval request (a new
// approval needs a person anyway). The caller holds a.mu.
func (a *Agent) acknowledged(op *Operation) bool {
	if op.State() != StateSucceeded || !resendable(op) || a.isApprovalRequest(op) {
		return false
	}
	for _, at := range op.Attempts {
		if r := at.Finished; r != nil && r.Status >= 200 && r.Status < 300 {
			return true
		}
	}
	for _, o := range op.Observations {
		if (o.Kind == ObsLookup || o.Kind == ObsPoll) && o.Found != nil && *o.Found && o.ServerState == "succeeded" {
			return true
		}
	}
	return false
}

// refusedNotFound reports whether op was refused with a 404, which a lost resource of its path may explain.
func refusedNotFound(op *Operation) bool {
	return op.State() == StateRefused && op.Settled.HTTPStatus == http.StatusNotFound && resendable(op)
}

// resourceID is the id an answer's body names at its top level, or "".
func resourceID(body json.RawMessage) string {
	var b struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &b)
	return b.ID
}

// madeIDs are the ids of what op's successful answers made, oldest first: the ids they named, less those op
// itself was sent with (a capture answers with the intent it captured; it did not make it).
func madeIDs(op *Operation) []string {
	var out []string
	for _, at := range op.Attempts {
		r := at.Finished
		if r == nil || r.Status < 200 || r.Status >= 300 {
			continue
		}
		if id := resourceID(r.Body); id != "" && !sentWith(op, id) {
			out = append(out, id)
		}
	}
	return out
}

// sentWith reports whether op names id in its path or its arguments.
func sentWith(op *Operation, id string) bool {
	var args map[string]any
	_ = json.Unmarshal(op.Args, &args)
	for _, v := range args {
		if v == id {
			return true
		}
	}
	return pathNames(op.Path, id)
}

// pathNames reports whether a segment of path is id.
func pathNames(path, id string) bool {
	for _, seg := range strings.Split(path, "/") {
		if v, err := url.PathUnescape(seg); err == nil && v == id {
			return true
		}
	}
	return false
}

// maker is an earlier operation of the journal that made a resource op's path names.
type maker struct {
	id string
	op *Operation
}

// makersOf are the operations before op in the journal that made a resource its path names. The caller holds
// a.mu.
func (a *Agent) makersOf(op *Operation) []maker {
	var out []maker
	for _, seg := range strings.Split(op.Path, "/") {
		id, err := url.PathUnescape(seg)
		if err != nil || id == "" {
			continue
		}
		for _, m := range a.v.order {
			if m == op {
				break
			}
			if slices.Contains(madeIDs(m), id) {
				out = append(out, maker{id: id, op: m})
				break
			}
		}
	}
	return out
}

// movedIDs maps each resource op's path names that its maker has made again since, under another id, to that
// id. The caller holds a.mu.
func (a *Agent) movedIDs(op *Operation) map[string]string {
	moved := map[string]string{}
	for _, m := range a.makersOf(op) {
		if m.op.State() != StateSucceeded {
			continue
		}
		if now := resourceID(m.op.Settled.Body); now != "" && now != m.id {
			moved[m.id] = now
		}
	}
	return moved
}

// rebound is path with each segment that names a key of moved replaced by its value.
func rebound(path string, moved map[string]string) string {
	segs := strings.Split(path, "/")
	for i, seg := range segs {
		if v, err := url.PathUnescape(seg); err == nil && moved[v] != "" {
			segs[i] = url.PathEscape(moved[v])
		}
	}
	return strings.Join(segs, "/")
}

// stillThere asks op's service for the operation it acknowledged, by id (by key when no answer named one),
// and journals the answer: whether the service has it, nil when it could not tell. The caller holds op's
// action lock.
func (a *Agent) stillThere(ctx context.Context, op *Operation) (*bool, error) {
	ask := a.lookup
	if op.ServerOperationID() != "" {
		ask = a.poll
	}
	if err := ask(ctx, op); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return op.Observations[len(op.Observations)-1].Found, nil
}

// remake journals that the service no longer has op, which it acknowledged (operation_lost, with the path it
// goes to now), and drives it again under its key. The caller holds op's action lock.
func (a *Agent) remake(ctx context.Context, op *Operation) (Result, error) {
	a.mu.Lock()
	lost, path := op.ServerOperationID(), rebound(op.Path, a.movedIDs(op))
	a.mu.Unlock()
	detail := fmt.Sprintf("the service answers 404 for operation %s, which it acknowledged: sent again under the same "+
		"key and body, which it makes once", lost)
	if path != op.Path {
		detail += "; to " + path + ", where the resource its path named was made again"
	}
	found := false
	if err := a.record(&Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsLost, Found: &found,
		LostServerOpID: lost, Path: path, Detail: detail, RunID: a.runID, At: a.now()}); err != nil {
		return Result{}, err
	}
	return a.drive(ctx, op, lastApproval(op))
}

// remakeIfLost asks the service for m, an acknowledged operation, and makes it again when the service no
// longer has it; it reports whether it did, and m succeeded again.
func (a *Agent) remakeIfLost(ctx context.Context, m *Operation) (bool, error) {
	unlock := a.lockAction(m.ActionID)
	defer unlock()
	a.mu.Lock()
	ack := a.acknowledged(m)
	a.mu.Unlock()
	if !ack {
		return false, nil
	}
	found, err := a.stillThere(ctx, m)
	if err != nil || found == nil || *found {
		return false, err
	}
	res, err := a.remake(ctx, m)
	return err == nil && res.State == StateSucceeded, err
}

// remakeDependencies is the rule after a 404 for op: when its path names a resource an earlier action of the
// journal made and the service acknowledged, and the service no longer has that action's operation either,
// the earlier action is made again first, under its own key, and op goes again (dependency_remade), to the
// resource made again. It reports whether op is to be sent again. The caller holds op's action lock.
func (a *Agent) remakeDependencies(ctx context.Context, op *Operation) (bool, error) {
	a.mu.Lock()
	var makers []maker
	var moved map[string]string
	if last := lastAttempt(op); last != nil && last.Finished != nil && last.Finished.Status == http.StatusNotFound && resendable(op) {
		makers, moved = a.makersOf(op), a.movedIDs(op)
	}
	a.mu.Unlock()
	if len(makers) == 0 {
		return false, nil
	}
	remade := false
	for _, m := range makers {
		if moved[m.id] != "" {
			continue // made again already: op only has to follow it
		}
		ok, err := a.remakeIfLost(ctx, m.op)
		if err != nil {
			return false, err
		}
		remade = remade || ok
	}
	a.mu.Lock()
	moved = a.movedIDs(op)
	a.mu.Unlock()
	if !remade && len(moved) == 0 {
		return false, nil
	}
	path := rebound(op.Path, moved)
	return true, a.record(&Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsDependencyRemade,
		Status: http.StatusNotFound, Path: path, RunID: a.runID, At: a.now(),
		Detail: "the service answered 404 for " + op.Path + ": a resource it names was lost with the action that " +
			"made it, which was made again under its own key; sent again under this one's key to " + path})
}
