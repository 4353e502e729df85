package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// Delegation: one owner per operation (seed 004). A planner hands an action to a worker with Do and
// DoOptions.DelegateTo: its journal records the operation (id, arguments, derived key) and the worker's journal,
// and sends nothing. The worker runs the action in its own journal with DoOptions.ParentOperation: its
// operation names the parent's, derives the same key (same namespace, same action id), and each of its
// attempts names the worker's process. The parent owns retries:
//
//   - a worker whose attempt may have reached the service (no answer, or a process that died mid-attempt) does
//     not send again on its own: it stops needs_human with CodeParentOwnsRetries and its dispatch state;
//   - the parent reads the worker's journal before deciding (Do again, or Resume, which finds every delegated
//     operation): a settled worker settles the parent; a worker still holding its journal is in progress; a
//     worker that died, or stopped with an unknown outcome, leaves the parent's operation StateUnresolved, which
//     the parent reconciles by looking its key up: the service's record settles it, and nothing else does. A
//     missing child result never makes the parent send the write itself.
//
// Fact-gathering calls (read-only tools, read commands) are intents of their own: they take no parent
// operation, and get operations of their own.

// StateUnresolved: a delegated operation whose worker died or stopped with an unknown outcome, and which the
// service's record has not settled. Resume reads the worker and looks the key up again; it never sends.
const StateUnresolved = "unresolved"

// Codes of delegated operations' results.
const (
	// CodeParentOwnsRetries: a worker's attempt may have reached the service, and the retry is its parent's
	// decision, not the worker's.
	CodeParentOwnsRetries = "parent_owns_retries"
	// CodeOperationUnresolved: the parent found its worker dead or stopped with an unknown outcome, and the
	// service's record did not settle the operation.
	CodeOperationUnresolved = "operation_unresolved"
)

// ObsWorkerState is the observation of a delegated operation's worker, read from the worker's journal.
const ObsWorkerState = "worker_state"

// Delegation is, on a parent's operation, where its worker journals it.
type Delegation struct {
	WorkerJournal string `json:"worker_journal"`
}

// Process names the process that made an attempt: a worker's attempts name theirs.
type Process struct {
	Host string `json:"host"`
	PID  int    `json:"pid"`
}

// checkDelegation refuses delegation options that do not fit the tool, before anything is journaled.
func checkDelegation(tool Tool, opts DoOptions) error {
	if opts.ParentOperation != "" {
		if !validID(opts.ParentOperation) || !strings.HasPrefix(opts.ParentOperation, "aop_") {
			return fmt.Errorf("%w: a parent operation is the parent journal's operation id (aop_...)", ErrBadArguments)
		}
		if tool.Mode == ReadOnly {
			return fmt.Errorf("%w: %s gathers facts: it is an intent of its own, with an operation of its own, never "+
				"the parent's (call it without a parent operation)", ErrBadArguments, tool.Name)
		}
	}
	if opts.DelegateTo != "" {
		if tool.ApprovalRequest || tool.Mode == ReadOnly {
			return fmt.Errorf("%w: %s is not delegated: only a write is handed to a worker", ErrBadArguments, tool.Name)
		}
		if opts.ParentOperation != "" || opts.Supersedes != "" || opts.Remediates != "" {
			return fmt.Errorf("%w: a delegated action takes no parent operation, supersedes or remediates", ErrBadArguments)
		}
	}
	return nil
}

// delegated is the result of handing op to its worker: nothing was sent.
func (a *Agent) delegated(op *Operation) Result {
	r := a.result(op)
	r.NextStep = fmt.Sprintf("handed to a worker, nothing sent: the worker runs it in %s with the same action id and "+
		"arguments and --parent-operation %s --parent-run %s; then call this action again, or run resume, to read "+
		"the worker's state", op.Delegation.WorkerJournal, op.OperationID, a.runID)
	return r
}

// workerReport is what the parent reads of its worker.
type workerReport struct {
	op      *Operation // the worker's operation for the parent's, nil when it has none
	running bool       // the worker holds its journal
	detail  string
}

// readWorker reads the worker's journal without its lock: whole lines only, as show does.
func readWorker(op *Operation) workerReport {
	path := op.Delegation.WorkerJournal
	recs, err := ReadRecords(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return workerReport{detail: "the worker's journal " + path + " does not exist: the worker never took the action"}
	case err != nil:
		return workerReport{detail: "the worker's journal " + path + " cannot be read: " + err.Error()}
	}
	v := newView()
	for _, rec := range recs {
		if err := v.apply(rec); err != nil {
			return workerReport{detail: "the worker's journal " + path + " cannot be read: " + err.Error()}
		}
	}
	w := workerReport{running: journalHeld(path)}
	wop := v.byAction[op.ActionID]
	switch {
	case wop == nil:
		w.detail = "the worker's journal has no operation for action " + op.ActionID
	case wop.ParentOperationID != op.OperationID:
		w.detail = fmt.Sprintf("the worker's operation %s for action %s names parent %q, not this one", wop.OperationID,
			op.ActionID, wop.ParentOperationID)
	default:
		w.op = wop
		w.detail = fmt.Sprintf("worker operation %s: state %s, %d attempts, last dispatch %s", wop.OperationID,
			wop.State(), len(wop.Attempts), lastDispatch(wop))
		if at := lastAttempt(wop); at != nil && at.Process != nil {
			w.detail += fmt.Sprintf(", process %s pid %d", at.Process.Host, at.Process.PID)
		}
	}
	if w.running {
		w.detail += "; the worker holds its journal (running)"
	}
	return w
}

// lastDispatch is the dispatch state of op's last attempt, in words.
func lastDispatch(op *Operation) string {
	at := lastAttempt(op)
	switch {
	case at == nil:
		return "none (nothing sent)"
	case at.Finished == nil:
		return "started, no end recorded (may have been sent)"
	}
	return at.Finished.DispatchState
}

// journalHeld reports whether an agent holds the journal at path: a shared lock cannot be taken while an
// agent holds its exclusive one, and the kernel drops that one when the agent dies.
func journalHeld(path string) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// decideDelegated is the parent's rule for an operation it handed to a worker: read the worker, then settle as
// it did, wait while it runs, or reconcile from the service's record. It never sends.
func (a *Agent) decideDelegated(op *Operation) step {
	w := readWorker(op)
	since := ""
	if op.Settled != nil {
		since = op.Settled.At
	}
	seen, looked := workerObservations(op)
	seen = a.noteWorker(op, w, seen, since)
	if wop := w.op; wop != nil && wop.Final() && (wop.Settled.State != StateNeedsHuman || wop.Settled.Code != CodeParentOwnsRetries) {
		s := wop.Settled
		return step{kind: "settle", state: s.State, code: s.Code, fromLookup: true, status: s.HTTPStatus, body: s.Body,
			why: "the worker settled it: " + s.Reason, next: s.NextStep + " (in the worker's journal " + op.Delegation.WorkerJournal + ")"}
	}
	if w.running {
		return step{kind: "settle", state: StateInProgress, fromLookup: true, why: "the worker is still running it",
			next: "the worker holds its journal: call this action again, or run resume, later; nothing is sent from here"}
	}
	// The worker died, never took it, or stopped with an unknown outcome: the service's record decides.
	if op.IdempotencyKey != "" && op.Command == nil && (looked == nil || looked.At < seen.At || looked.At < since) {
		return step{kind: "lookup", decision: "worker_unresolved_look_up"}
	}
	return workerUnresolved(op, w, looked)
}

// workerObservations are op's newest observation of its worker's state and its newest lookup, nil when none.
func workerObservations(op *Operation) (seen, looked *Observation) {
	for _, o := range op.Observations {
		switch o.Kind {
		case ObsWorkerState:
			seen = o
		case ObsLookup:
			looked = o
		}
	}
	return seen, looked
}

// noteWorker journals what the worker's journal says when it is news: it differs from the last observation of
// it, or none was made since op last settled. It returns the observation that stands.
func (a *Agent) noteWorker(op *Operation, w workerReport, seen *Observation, since string) *Observation {
	if seen != nil && seen.Detail == w.detail && seen.At >= since {
		return seen
	}
	ob := Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsWorkerState, Detail: w.detail,
		RunID: a.runID, At: a.now()}
	if w.op != nil {
		ob.ServerOperationID = w.op.ServerOperationID()
	}
	_ = a.record(ob)
	return &ob
}

// workerUnresolved settles a delegated operation the worker did not settle: as the service's record says when
// a lookup found it settled, otherwise unresolved, for the worker or a person.
func workerUnresolved(op *Operation, w workerReport, looked *Observation) step {
	if looked != nil && looked.Found != nil && *looked.Found {
		switch looked.ServerState {
		case "succeeded":
			return step{kind: "settle", state: StateSucceeded, fromLookup: true,
				why:  "the worker's result is missing; the service has the operation under the key, succeeded",
				next: "done: nothing more to do for this action"}
		case "failed", "cancelled":
			return step{kind: "settle", state: StateFailed, fromLookup: true,
				why:  "the worker's result is missing; the service has the operation under the key, " + looked.ServerState,
				next: "the service says it did not happen: to try again, a new action id"}
		}
	}
	why := "the worker's result is missing or its outcome unknown (" + w.detail + ")"
	if looked != nil {
		why += "; lookup: " + lookupWords(looked)
	}
	return step{kind: "settle", state: StateUnresolved, code: CodeOperationUnresolved, fromLookup: true, why: why,
		next: fmt.Sprintf("not sent again from here: a missing worker result is no reason to run the write twice. Have the "+
			"worker settle it (retrysafe agent resume --journal %s; a person may retry it there with agent retry), or a "+
			"person records what happened (retrysafe agent resolve %s on this journal); resume here reads the worker "+
			"and the service again", op.Delegation.WorkerJournal, op.ActionID)}
}

func lookupWords(o *Observation) string {
	switch {
	case o.Found == nil:
		return o.Detail
	case !*o.Found:
		return "the service has no operation under the key"
	}
	return "the service has operation " + o.ServerOperationID + ", state " + o.ServerState
}

// parentOwnsRetry is a worker's stop after an attempt that may have reached the service: its parent decides.
func parentOwnsRetry(op *Operation) step {
	return step{kind: "settle", state: StateNeedsHuman, code: CodeParentOwnsRetries, fromLookup: true,
		why: "its last attempt may have reached the service (dispatch: " + lastDispatch(op) + "); the parent owns retries",
		next: fmt.Sprintf("not sent again by the worker: parent operation %s decides (retrysafe agent resume on the parent's "+
			"journal reads this one); a person may have it sent again here (retrysafe agent retry %s)", op.ParentOperationID, op.ActionID)}
}

// personSaidGo reports whether a person asked for op to go again (a retry, an approval) since its last attempt
// started: their word, not the worker's, sends it again.
func personSaidGo(op *Operation) bool {
	last := lastAttempt(op)
	for _, o := range op.Observations {
		if (o.Kind == ObsRetryRequested || o.Kind == ObsApproval) && (last == nil || o.At >= last.At) {
			return true
		}
	}
	return false
}

// process is the attempt's process, for a worker's attempts.
func (a *Agent) process(op *Operation) *Process {
	if op.ParentOperationID == "" {
		return nil
	}
	host, _ := os.Hostname()
	return &Process{Host: host, PID: os.Getpid()}
}
