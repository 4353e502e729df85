package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Lineage headers a caller may send on any write (docs/contract.md, "Attempts, lineage and evidence").
const (
	headerAgentRunID  = "Agent-Run-Id"
	headerRetryOf     = "Retry-Of"
	headerRetryReason = "Retry-Reason"
	HeaderSupersedes  = "Supersedes-Operation-Id"
)

// Headers that only some writes take, each where its Request says so (Request.Takes): Approval-Id on a write
// that takes approvals (package approval), and Grant-Id on the same writes; Remediates-Operation-Id on a payments
// refund. Sent to another write they are refused before its key is read, never dropped (checkTakes).
const (
	HeaderApprovalID = "Approval-Id"
	headerGrantID    = "Grant-Id"
	HeaderRemediates = "Remediates-Operation-Id"
)

// checkTakes refuses a header of a write that does not take it: an Approval-Id is an approval that cannot
// apply, 403 approval_invalid as the contract answers an unknown one; another is 400 invalid_request naming it.
func checkTakes(h http.Header, takes []string) error {
	if vs := h.Values(HeaderApprovalID); len(vs) > 0 && !slices.Contains(takes, HeaderApprovalID) {
		err := problem.New("approval_invalid", "this write takes no approval: the %s header cannot apply to it", HeaderApprovalID)
		if len(vs) == 1 && ids.ValidSent(vs[0]) {
			err = err.With("approval_id", vs[0])
		}
		return err
	}
	if len(h.Values(headerGrantID)) > 0 && !slices.Contains(takes, HeaderApprovalID) {
		return problem.New("grant_invalid", "this write takes no approval, so no grant: the %s header cannot apply to it", headerGrantID)
	}
	if len(h.Values(HeaderRemediates)) > 0 && !slices.Contains(takes, HeaderRemediates) {
		return headerProblem(HeaderRemediates, "cannot apply to this write: only a payments refund corrects an operation")
	}
	return nil
}

// RetryReasons is the fixed list a Retry-Reason must come from: reasons that can be grouped and checked, never
// an agent's free-text explanation.
var RetryReasons = []string{
	"connection_not_established", "rate_limited", "destination_5xx", "response_lost_after_dispatch",
	"credential_refreshed", "operator_requested", "request_in_progress",
}

// Outcomes of an attempt, as its record's outcome field says (Outcome is the metrics' view of the same).
const (
	attemptCreated          = "created"           // it claimed the key and its result was stored
	attemptReplayed         = "replayed"          // the stored result was sent again
	attemptResponseExpired  = "response_expired"  // the key lives, its stored result was pruned: 409, not run
	attemptConflictRejected = "conflict_rejected" // same key, another request: 422
	attemptInProgress       = "in_progress"       // the first attempt was still running: 409
	attemptUnknown          = "unknown"           // the outcome is not known yet: 202
	attemptRefused          = "refused"           // refused after the key was found (a bad Retry-Of), or a stored failure
)

// lineage is what an attempt says about itself. attemptSent: the caller sent its attempt id (Attempt-Id), which
// may then repeat one the operation has; an id the server made is new.
type lineage struct {
	attempt     string
	attemptSent bool
	agentRun    string
	// grant is the Grant-Id the attempt was sent under; the Guard checks it and uses it (package approval).
	grant       string
	retryOf     string
	retryReason string
	supersedes  string
	start       time.Time
}

func headerProblem(name, detail string) error {
	return problem.New("invalid_request", "the %s header %s", name, detail).With("header", name)
}

// parseLineage validates the lineage headers; a malformed one is 400 invalid_request naming it. attemptID is the
// adapter's (gin's middleware makes one); when empty it is the Attempt-Id header, or a new one.
func parseLineage(h http.Header, attemptID string) (lineage, error) {
	if attemptID == "" {
		attemptID = ids.AttemptIDOf(h)
	}
	l := lineage{attempt: attemptID, attemptSent: len(h.Values(ids.HeaderAttemptID)) > 0, start: time.Now()}
	for _, f := range []struct {
		name  string
		dst   *string
		check func(string) bool
		want  string
	}{
		{ids.HeaderAttemptID, nil, ids.ValidSent, "must be 1 to 128 printable ASCII characters"},
		{headerAgentRunID, &l.agentRun, ids.ValidSent, "must be 1 to 128 printable ASCII characters"},
		{headerGrantID, &l.grant, func(v string) bool { return ids.Valid("grt_", v) }, "must be a grant id (grt_...)"},
		{headerRetryOf, &l.retryOf, ids.ValidSent, "must be an earlier Attempt-Id: 1 to 128 printable ASCII characters"},
		{headerRetryReason, &l.retryReason, func(v string) bool { return slices.Contains(RetryReasons, v) },
			"must be one of " + strings.Join(RetryReasons, ", ")},
		{HeaderSupersedes, &l.supersedes, func(v string) bool { return ids.ValidSent(v) && len(v) > 3 && v[:3] == "op_" },
			"must be an operation id (op_...)"},
	} {
		vs := h.Values(f.name)
		switch {
		case len(vs) == 0:
			continue
		case len(vs) > 1:
			return lineage{}, headerProblem(f.name, "must be sent once")
		case !f.check(vs[0]):
			return lineage{}, headerProblem(f.name, f.want)
		}
		if f.dst != nil {
			*f.dst = vs[0]
		}
	}
	if l.retryReason != "" && l.retryOf == "" {
		return lineage{}, headerProblem(headerRetryReason, "needs Retry-Of: the attempt this one retries")
	}
	return l, nil
}

// identity is what every event an attempt causes says about it.
func (l lineage) identity() opstore.Attempt {
	d := opstore.Attempt{AttemptID: l.attempt, AgentRunID: l.agentRun, GrantID: l.grant, RetryOf: l.retryOf}
	if l.retryOf != "" {
		reason := l.retryReason
		d.RetryReason = &reason
	}
	return d
}

// told is the detail of an answer told to the attempt without an outcome (its record exists already): its
// identity and the status it was answered.
func (l lineage) told(status int) opstore.Attempt {
	d := l.identity()
	d.Status = &status
	return d
}

// record is an attempt record's detail: its identity, its outcome and answer, how long it took so far, and what
// extra adds (the verdict's own fields). Its number within the operation is its place among the operation's
// attempt records (operation_events_numbered).
func (a *attempt) record(outcome string, status int, extra opstore.Attempt) opstore.Attempt {
	d := extra
	id := a.lineage.identity()
	d.AttemptID, d.AgentRunID, d.GrantID, d.RetryOf, d.RetryReason = id.AttemptID, id.AgentRunID, id.GrantID, id.RetryOf, id.RetryReason
	ms := time.Since(a.lineage.start).Milliseconds()
	d.Outcome, d.Status, d.Fingerprint, d.DurationMS = outcome, &status, a.fingerprint, &ms
	return d
}

// checkClaimLineage runs in the claim's transaction of a new operation: a new operation has no earlier attempt
// to retry, and the operation it supersedes must be one of the same account and kind, not superseded yet and not
// unknown unless req.SupersedeUnknown says a person approved this request, which learns of the link.
func (h *Handler) checkClaimLineage(ctx context.Context, tx *database.Tx, a *attempt, req Request) error {
	if a.lineage.retryOf != "" {
		return headerProblem(headerRetryOf, "names an attempt this operation never had: the Idempotency-Key is new")
	}
	if a.lineage.supersedes == "" {
		return nil
	}
	var prior opstore.Superseded
	b := &pgx.Batch{}
	opstore.QueueSuperseded(b, a.op.AccountID, a.lineage.supersedes, &prior)
	switch err := tx.Send(ctx, b); {
	case errors.Is(err, pgx.ErrNoRows):
		return headerProblem(HeaderSupersedes, "names no operation of this account")
	case err != nil:
		return fmt.Errorf("idem: supersedes: %w", err)
	case prior.Kind != a.op.Kind:
		return headerProblem(HeaderSupersedes, "names an operation of another kind ("+prior.Kind+"); only an operation of the same kind can be superseded")
	case prior.Superseded:
		return headerProblem(HeaderSupersedes, "names an operation already superseded by another")
	case prior.State == string(opstatus.StateUnknown):
		// Its effect may still have happened: a new attempt at the same intent could double it, unless a person
		// who was shown that decided so.
		approved := false
		if req.SupersedeUnknown != nil {
			var err error
			if approved, err = req.SupersedeUnknown(ctx, tx.Gorm(), a.op, a.fingerprint, a.lineage.supersedes); err != nil {
				return err
			}
		}
		if !approved {
			return problem.New("superseded_operation_unknown",
				"the operation this one supersedes has an unknown outcome: settle it first (a retry with its key, or a person's "+
					"resolution), or have a person approve this exact request naming it (Approval-Id)").
				With("operation_id", a.lineage.supersedes).With("state", prior.State)
		}
	}
	err := opstatus.Append(ctx, tx.SQL(), a.op.AccountID, a.lineage.supersedes, opstore.EventSuperseded, a.caller.Actor,
		opstore.Link{SupersededBy: a.op.ID, AttemptID: a.lineage.attempt})
	if opstore.SuccessorTaken(err) {
		// Another operation superseded it after this one looked (operation_events_successor): it committed first.
		return headerProblem(HeaderSupersedes, "names an operation already superseded by another")
	}
	return err
}

// Why a retry's lineage headers were refused: the refusal of its record.
const (
	refusalUnknownRetryOf     = "unknown_retry_of"
	refusalAttemptIDUsed      = "attempt_id_used"
	refusalSupersedesMismatch = "supersedes_mismatch"
)

// lineageRefusal is a retry refused for its lineage headers: the problem to answer and why, for its record.
type lineageRefusal struct {
	err    error
	reason string
}

// checkRetry checks the lineage headers of a request whose key found operation opID: Supersedes-Operation-Id
// must repeat what the operation's claim said (a header that cannot apply is refused, not dropped); the attempt
// Retry-Of names must be an attempt of that operation, recorded or still running (its claim), not this one; and
// an Attempt-Id the caller sent must be new to the operation. A refusal is a 400 naming the header. A request
// with none of these headers is not checked.
func (h *Handler) checkRetry(ctx context.Context, a *attempt, opID string) (*lineageRefusal, error) {
	if opID == a.op.ID {
		// The attempt that claimed the operation, answered from its key (another worker settled it first): its
		// lineage was checked at its claim, and its attempt id is its own.
		return nil, nil
	}
	if a.lineage.supersedes != "" {
		var claimed string
		b := &pgx.Batch{}
		opstore.QueueClaimedSupersedes(b, a.op.AccountID, opID, &claimed)
		if err := database.Send(ctx, h.DB, b); err != nil {
			return nil, fmt.Errorf("idem: supersedes: %w", err)
		}
		if claimed != a.lineage.supersedes {
			return &lineageRefusal{headerProblem(HeaderSupersedes, "cannot apply: this Idempotency-Key's operation exists and did not supersede that operation"),
				refusalSupersedesMismatch}, nil
		}
	}
	if a.lineage.retryOf != "" && a.lineage.retryOf == a.lineage.attempt {
		return &lineageRefusal{headerProblem(headerRetryOf, "names this attempt itself"), refusalUnknownRetryOf}, nil
	}
	if a.lineage.retryOf == "" && !a.lineage.attemptSent {
		return nil, nil
	}
	var parentKnown, attemptUsed bool
	b := &pgx.Batch{}
	opstore.QueueAttemptKnown(b, a.op.AccountID, opID, a.lineage.retryOf, a.lineage.attempt, &parentKnown, &attemptUsed)
	if err := database.Send(ctx, h.DB, b); err != nil {
		return nil, fmt.Errorf("idem: retry-of: %w", err)
	}
	switch {
	case a.lineage.retryOf != "" && !parentKnown:
		return &lineageRefusal{headerProblem(headerRetryOf, "names no earlier attempt of this operation"), refusalUnknownRetryOf}, nil
	case attemptUsed:
		return attemptIDUsed(), nil
	}
	return nil, nil
}

// attemptIDUsed is the refusal of an attempt whose Attempt-Id the operation already has.
func attemptIDUsed() *lineageRefusal {
	return &lineageRefusal{headerProblem(ids.HeaderAttemptID, "was already used by another attempt of this operation"), refusalAttemptIDUsed}
}

// claimDetail is the detail of the claimed event.
func (a *attempt) claimDetail() opstore.Attempt {
	detail := a.lineage.identity()
	detail.SupersedesOperationID, detail.Owner = a.lineage.supersedes, a.owner
	return detail
}

// completionDetail is the detail of the event that records the result: the attempt record of the attempt that
// claimed the key, or its status alone for a worker's settlement; reason, when set, is the result's.
func (a *attempt) completionDetail(status int, reason string) opstore.Attempt {
	var detail opstore.Attempt
	switch {
	case a.lineage.attempt == "" || a.attemptRecorded:
		// A worker's settlement has no attempt; an attempt whose record the recovery worker already wrote (outcome
		// unknown, its lease ran out) has its result told without an outcome, so it is not numbered twice.
		detail = a.lineage.told(status)
	case status >= http.StatusBadRequest:
		detail = a.record(attemptRefused, status, opstore.Attempt{})
	default:
		detail = a.record(attemptCreated, status, opstore.Attempt{})
	}
	detail.Reason = reason
	return detail
}
