package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Grants. A person with an approver key can grant this agent's key (or one run of it) authority for a group of
// writes: operation kinds, a number of uses and an expiry (POST /v1/grants, package approval). Config.GrantID
// names it; every attempt of a tool that takes approvals is then sent with Grant-Id, unless a person's
// approval_id goes with it, and its attempt_started record names the grant (Attempt.GrantID), before it is sent.
// The service uses one of the grant's uses in the claim of each new write and records which operation and
// attempt used it; `retrysafe audit verify --journal` compares the two records.
//
// A grant the service refuses (revoked, expired, used up, of other kinds: 403 grant_invalid) stops the action
// needs_human: nothing ran, and the next step says to ask a person for a new grant or an approval. Calling again
// with another grant, or with approval_id, sends it again with the same key.
//
// A grant never stands in for a person's approval of a replacement of an operation whose outcome is unknown:
// holdForSuperseded still holds it until the old one settles or approval_id is given, and the services refuse a
// write that supersedes an unknown operation without an approval of its own.

// CodeGrantInvalid is the services' code for a grant that cannot authorize the write.
const CodeGrantInvalid = "grant_invalid"

// ObsGrant is the observation of a grant given with a call after the last one was refused: like an approval, a
// person's word that the action may go on, with a fresh budget.
const ObsGrant = "grant_given"

// grantFor is the grant an attempt of op is sent under: Config.GrantID, for an HTTP tool that takes approvals,
// when no approval is sent with it (a write carries one or the other).
func (a *Agent) grantFor(op *Operation, approvalID string) string {
	if a.cfg.GrantID == "" || approvalID != "" || op.Command != nil || !a.takesApproval(op.Tool) {
		return ""
	}
	return a.cfg.GrantID
}

// grantRefused is the step after a 403 grant_invalid: nothing ran; a person gives a new grant or an approval.
func grantRefused(op *Operation, res *AttemptResult) step {
	reason := "refused"
	if v := problemMember(res.Body, "reason"); v != "" {
		reason = v
	}
	grant := ""
	if last := lastAttempt(op); last != nil {
		grant = last.GrantID
	}
	return step{kind: "settle", state: StateNeedsHuman, why: fmt.Sprintf("the service refused grant %s (%s); nothing ran", grant, reason),
		next: fmt.Sprintf("grant %s no longer covers this write (%s): ask a person for a new grant (--grant) or an approval "+
			"(request_approval with {\"for_action\": %q}), then call %s again with the same action_id and arguments", grant, reason,
			op.ActionID, op.Tool)}
}

// grantGiven records that a grant other than the one last refused came with a call of op, stopped needs_human
// by grant_invalid, and reports whether it did: the operation then goes again under the new grant.
func (a *Agent) grantGiven(op *Operation) (bool, error) {
	last := lastAttempt(op)
	if op.Settled == nil || op.Settled.Code != CodeGrantInvalid || last == nil || a.grantFor(op, "") == "" ||
		a.cfg.GrantID == last.GrantID {
		return false, nil
	}
	err := a.record(Observation{Type: RecObservation, OperationID: op.OperationID, Kind: ObsGrant, RunID: a.runID, At: a.now(),
		Detail: "grant " + a.cfg.GrantID + " given; the budget starts again"})
	return err == nil, err
}

// validGrantID reports whether id can be a grant id (grt_ and a UUID).
func validGrantID(id string) bool {
	rest, ok := strings.CutPrefix(id, "grt_")
	return ok && len(rest) == 36 && validID(id)
}

// GrantAttempt is one attempt of a journal sent under a grant, and how it ended as the journal says.
type GrantAttempt struct {
	OperationID string
	ActionID    string
	AttemptID   string
	GrantID     string
	// Status is the service's answer (0 when none came); Replayed, that it replayed a stored answer (the
	// attempt used no grant: the first one did); ServerOperationID, the service's operation.
	Status            int
	Replayed          bool
	Code              string
	ServerOperationID string
}

// JournalGrants returns the attempts of the journal at path that were sent under a grant, in journal order. It
// reads the journal without locking it; VerifyJournal checks its chain.
func JournalGrants(path string) ([]GrantAttempt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("agent: grants: %w", err)
	}
	defer f.Close()
	entries, _, err := readEntries(f)
	if err != nil {
		return nil, err
	}
	v := newView()
	for _, e := range entries {
		if err := v.apply(e.Record); err != nil {
			return nil, err
		}
	}
	var out []GrantAttempt
	for _, op := range v.order {
		for _, at := range op.Attempts {
			if at.GrantID == "" {
				continue
			}
			g := GrantAttempt{OperationID: op.OperationID, ActionID: op.ActionID, AttemptID: at.AttemptID, GrantID: at.GrantID}
			if r := at.Finished; r != nil {
				g.Status, g.Replayed, g.Code, g.ServerOperationID = r.Status, r.Replayed, r.Code, r.ServerOperationID
			}
			out = append(out, g)
		}
	}
	return out, nil
}

// problemMember is the string member name of a problem body, "" when it has none.
func problemMember(body json.RawMessage, name string) string {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return ""
	}
	s, _ := m[name].(string)
	return s
}
