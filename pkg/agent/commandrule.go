package agent

import (
	"fmt"
	"slices"
	"time"

	"github.com/retrysafe/retrysafe/pkg/agent/opmarker"
)

// maxFailedChecks is how many converge checks in a row may give no answer before the operation goes to a person.
const maxFailedChecks = 3

// decideCommand is the retry rule of a command operation: from its last attempt's boundary and its family.
func (a *Agent) decideCommand(op *Operation) step {
	last := lastAttempt(op)
	if last == nil {
		return step{kind: "send", decision: "first_attempt"}
	}
	obs := observationsSince(op, last)
	backoff := a.backoff(len(op.Attempts) - op.budgetFrom + len(obs))
	if approvedSince(op, last) || retryRequestedSince(op, last) {
		return step{kind: "send", reason: ReasonOperatorRequested, decision: "person_decided_run_again"}
	}
	switch a.commandBoundary(op, last, obs) {
	case BoundaryNotStarted:
		return step{kind: "send", reason: ReasonConnectionNotEstablished, decision: "not_started_run_again", wait: backoff}
	case BoundaryExitReceived:
		return exitStep(last.Finished)
	}
	ci := op.Command
	if op.ParentOperationID != "" && ci.Family != FamilyRead && !personSaidGo(op) {
		return parentOwnsRetry(op)
	}
	switch ci.Family {
	case FamilyRead:
		return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "read_runs_again", wait: backoff}
	case FamilyConverge:
		return a.convergeStep(obs, backoff)
	}
	if ci.Marker != nil {
		return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "effect_marker_answers", wait: backoff}
	}
	return step{kind: "settle", state: StateNeedsHuman, code: CodeCommandUnknown, fromLookup: true,
		why: "the command started on " + ci.Host + " and no exit code came back: it may have run",
		next: fmt.Sprintf("the effect command may or may not have run on %s (account %s), and running it again could repeat it: "+
			"`&&` in a command line guards one execution, not a second connection. A person checks the host for its effect "+
			"(the timeline shows the command: retrysafe agent show %s), then records what happened "+
			"(retrysafe agent resolve --state succeeded|failed --evidence ... %s), or has it run again "+
			"(retrysafe agent retry %s). Give the host a marker_dir so its marker answers next time",
			ci.Host, ci.Account, op.OperationID, op.ActionID, op.ActionID)}
}

// commandBoundary is how far the last attempt got. One whose process died before it recorded the end may have
// run (started); the first run to see it journals so.
func (a *Agent) commandBoundary(op *Operation, last *Attempt, obs []*Observation) string {
	res := last.Finished
	if res == nil {
		if !slices.ContainsFunc(obs, func(o *Observation) bool { return o.Kind == ObsInterrupted && o.AttemptID == last.AttemptID }) {
			_ = a.record(Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsInterrupted, AttemptID: last.AttemptID,
				RunID: a.runID, At: a.now(), Detail: "the agent stopped during this attempt: the command may have run"})
		}
		return BoundaryStarted
	}
	if res.Command != nil {
		return res.Command.Boundary
	}
	return BoundaryStarted
}

// exitStep settles an attempt whose exit code came back.
func exitStep(res *AttemptResult) step {
	cr := res.Command
	code := *cr.ExitCode
	if m := cr.Marker; m != nil {
		switch m.State {
		case opmarker.InProgress:
			return step{kind: "settle", state: StateNeedsHuman,
				why: "the host's marker says a run started and recorded no result: it is running, or died mid-way",
				next: "nothing was run again: a person checks the host (the marker " + m.Path + " and the command's effect) and " +
					"records what happened (retrysafe agent resolve), or waits and calls again with the same action_id"}
		case opmarker.Refused:
			return step{kind: "settle", state: StateFailed, why: "the host's marker helper refused it; nothing ran: " + m.Detail,
				next: "fix the host's marker directory or helper, then call again with a new action_id"}
		case opmarker.Replayed:
			if code == 0 {
				return step{kind: "settle", state: StateSucceeded, why: "the host's marker returned the result recorded by the run that did it; not run again",
					next: "done: nothing more to do for this action"}
			}
			return step{kind: "settle", state: StateFailed, why: fmt.Sprintf("the host's marker returned the recorded result: exit %d; not run again", code),
				next: "the command failed on the host: to try again, call with a new action_id"}
		}
	}
	if code == 0 {
		return step{kind: "settle", state: StateSucceeded, why: "the command exited 0", next: "done: nothing more to do for this action"}
	}
	return step{kind: "settle", state: StateFailed, why: fmt.Sprintf("the command exited %d", code),
		next: "the command failed on the host (the body has its output): to try again, call with a new action_id"}
}

// convergeStep follows a converge command whose end is unknown: its check first, and a second run only when
// the check says the state is not reached.
func (a *Agent) convergeStep(obs []*Observation, backoff time.Duration) step {
	var last *Observation
	failed := 0
	for _, o := range obs {
		if o.Kind != ObsCommandCheck {
			continue
		}
		last = o
		if o.Command == nil || o.Command.ExitCode == nil || *o.Command.ExitCode > 1 {
			failed++
		} else {
			failed = 0
		}
	}
	switch {
	case last == nil:
		return step{kind: "check", decision: "check_before_converging", wait: backoff / 4}
	case failed >= maxFailedChecks:
		return step{kind: "settle", state: StateNeedsHuman, fromLookup: true,
			why:  "the command started and its end is unknown, and its check gave no answer",
			next: "a person checks the host's state and records it (retrysafe agent resolve) or has it run again (retrysafe agent retry)"}
	case failed > 0:
		return step{kind: "check", decision: "check_again", wait: backoff}
	case *last.Command.ExitCode == 0:
		return step{kind: "settle", state: StateSucceeded, fromLookup: true,
			why:  "the command's end was lost, and its check says the state is reached; not run again",
			next: "done: nothing more to do for this action"}
	}
	return step{kind: "send", reason: ReasonResponseLostAfterDispatch, decision: "check_says_not_reached"}
}
