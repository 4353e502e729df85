package opstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// Timeline is one operation's story for an investigator: every attempt, dispatch, observation and state change
// in order, the approvals it used, the operations it replaces or that replace it, who settled it, and whether
// its audit records are intact. Links name other operations of the account: one it replaces or is
// replaced by, the duplicate it corrects or its correction, the operation that created what it deduplicated
// against or the operations deduplicated against it.
type Timeline struct {
	OperationID    string    `json:"operation_id"`
	Kind           string    `json:"kind"`
	State          State     `json:"state"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Fingerprint    string    `json:"fingerprint,omitempty"`
	Resource       *Resource `json:"resource"`
	// SettledBy is the actor of the event that moved the operation to its final state, if it has one.
	SettledBy    *string    `json:"settled_by"`
	SettledAt    *time.Time `json:"settled_at"`
	Supersedes   *string    `json:"supersedes_operation_id"`
	SupersededBy []string   `json:"superseded_by"`
	// Remediates is the duplicate_effect_confirmed operation this one corrects; RemediatedBy its correction.
	Remediates   *string  `json:"remediates_operation_id"`
	RemediatedBy []string `json:"remediated_by"`
	// DeduplicatedAgainst is the operation that created what this one found already there (a ticket of the
	// same source_event_id); DeduplicatedBy are the operations that found what this one created.
	DeduplicatedAgainst *string  `json:"deduplicated_against"`
	DeduplicatedBy      []string `json:"deduplicated_by"`
	// Start is the time of the first attempt (or the first record); every offset_ms counts from it.
	Start     time.Time          `json:"start"`
	Entries   []TimelineEntry    `json:"entries"`
	Approvals []TimelineApproval `json:"approvals"`
	Chain     ChainCheck         `json:"chain"`
}

// TimelineEntry is one record of the operation's history.
type TimelineEntry struct {
	Seq      int64     `json:"seq"`
	At       time.Time `json:"at"`
	OffsetMS int64     `json:"offset_ms"`
	// Category is attempt, dispatch, observation, approval, decision (a person's, operator_decision) or state.
	Category  string `json:"category"`
	Type      string `json:"type"`
	Actor     string `json:"actor"`
	FromState State  `json:"from_state,omitempty"`
	ToState   State  `json:"to_state,omitempty"`
	// Attempt fields, set on attempt records.
	Attempt     *int64 `json:"attempt,omitempty"`
	AttemptID   string `json:"attempt_id,omitempty"`
	AgentRunID  string `json:"agent_run_id,omitempty"`
	RetryOf     string `json:"retry_of,omitempty"`
	RetryReason string `json:"retry_reason,omitempty"`
	Outcome     string `json:"outcome,omitempty"`
	Status      *int   `json:"status,omitempty"`
	DurationMS  *int64 `json:"duration_ms,omitempty"`
	// SameFingerprint says whether the attempt sent the request the first attempt sent.
	SameFingerprint *bool `json:"same_fingerprint,omitempty"`
	// Reason is the fixed-list reason of an outcome_unknown, failed or reconciled record.
	Reason string          `json:"reason,omitempty"`
	Detail json.RawMessage `json:"detail,omitempty"`
}

// TimelineApproval is an approval the operation used, or one asked for its exact request (same account,
// Idempotency-Key and fingerprint) that it did not use: denied, revoked or expired.
type TimelineApproval struct {
	ApprovalID  string     `json:"approval_id"`
	State       string     `json:"state"`
	RequestedBy string     `json:"requested_by"`
	RequestedAt time.Time  `json:"requested_at"`
	DecidedBy   *string    `json:"decided_by"`
	DecidedAt   *time.Time `json:"decided_at"`
	// UsedByAttempt is the attempt whose claim used the approval.
	UsedByAttempt string `json:"used_by_attempt,omitempty"`
	// Records are the approval's own audit records (requested, approved, denied, revoked, used, expired), in
	// order; they are verified with the operation's (Timeline.Chain).
	Records []TimelineApprovalRecord `json:"records"`
}

// TimelineApprovalRecord is one record of an approval's history; Seq is its place in it.
type TimelineApprovalRecord struct {
	Seq   int64     `json:"seq"`
	At    time.Time `json:"at"`
	Type  string    `json:"type"`
	Actor string    `json:"actor"`
}

// ChainCheck is the verification of the operation's records (and its approvals') against the seals that hold
// them (package audit). Records counts them all: Sealed those a seal holds, tamper-evident; Unsealed those
// written too recently to be sealed yet (normally within AUDIT_SEAL_INTERVAL), which nothing vouches for yet.
type ChainCheck struct {
	Intact   bool     `json:"intact"`
	Records  int      `json:"records"`
	Sealed   int      `json:"sealed"`
	Unsealed int      `json:"unsealed"`
	Seals    int      `json:"seals"`
	Problems []string `json:"problems"`
}

// observationTypes are the events that record evidence gathered from outside (a provider lookup, a target's
// marker) rather than something this process did.
var observationTypes = map[string]bool{"provider_lookup": true, "target_lookup": true, "observed": true}

func category(ev Event) string {
	switch {
	case ev.Attempt != nil:
		return "attempt"
	case strings.HasPrefix(ev.Type, "dispatch_"):
		return "dispatch"
	case observationTypes[ev.Type]:
		return "observation"
	case strings.HasPrefix(ev.Type, "approval_"):
		return "approval"
	case ev.Type == opstore.EventOperatorDecision:
		return "decision"
	}
	return "state"
}

// GetTimeline returns the timeline of operation id of account. Returns an error matching problem.ErrNotFound
// if the operation does not exist in that account.
func GetTimeline(ctx context.Context, db database.Pool, accountID, id string) (Timeline, error) {
	op, err := Get(ctx, db, accountID, id)
	if err != nil {
		return Timeline{}, err
	}
	if op.EventsOmitted > 0 { // the timeline tells the whole story
		if op.Events, _, err = events(ctx, db, accountID, id, 0); err != nil {
			return Timeline{}, err
		}
	}
	tl := Timeline{
		OperationID: op.ID, Kind: op.Kind, State: op.State, IdempotencyKey: op.IdempotencyKey,
		Fingerprint: op.Fingerprint, Resource: op.Resource, Start: timelineStart(op),
		SupersededBy: []string{}, RemediatedBy: []string{}, DeduplicatedBy: []string{},
		Entries: make([]TimelineEntry, 0, len(op.Events)), Approvals: []TimelineApproval{},
	}
	tl.addEvents(op.Events)
	if tl.Approvals, err = timelineApprovals(ctx, db, op); err != nil {
		return Timeline{}, err
	}
	if tl.Chain, err = checkChain(ctx, db, accountID, id, tl.Approvals); err != nil {
		return Timeline{}, err
	}
	return tl, nil
}

// timelineStart is the time of op's first attempt (of its creation if it has none), or of its first event if
// that came earlier.
func timelineStart(op Operation) time.Time {
	start := op.CreatedAt
	for _, ev := range op.Events {
		if ev.Attempt != nil {
			start = ev.CreatedAt
			break
		}
	}
	if len(op.Events) > 0 && op.Events[0].CreatedAt.Before(start) {
		start = op.Events[0].CreatedAt
	}
	return start
}

// addEvents adds an entry per event, marks whether each attempt sent the first attempt's fingerprint, and
// gathers the operation's links and settlement from the events.
func (tl *Timeline) addEvents(events []Event) {
	var firstFingerprint string
	for _, ev := range events {
		// The detail is read by the types that wrote it; one of another shape still shows as detail.
		var d opstore.Attempt
		var link opstore.Link
		if len(ev.Detail) > 0 {
			_ = json.Unmarshal(ev.Detail, &d)
			_ = json.Unmarshal(ev.Detail, &link)
		}
		e := TimelineEntry{
			Seq: ev.Seq, At: ev.CreatedAt, OffsetMS: ev.CreatedAt.Sub(tl.Start).Milliseconds(), Category: category(ev),
			Type: ev.Type, Actor: ev.Actor, FromState: ev.FromState, ToState: ev.ToState, Attempt: ev.Attempt,
			AttemptID: d.AttemptID, AgentRunID: d.AgentRunID, RetryOf: d.RetryOf, RetryReason: deref(d.RetryReason),
			Outcome: d.Outcome, Status: d.Status, DurationMS: d.DurationMS, Reason: d.Reason, Detail: ev.Detail,
		}
		if ev.Attempt != nil && d.Fingerprint != "" {
			if firstFingerprint == "" {
				firstFingerprint = d.Fingerprint
			}
			same := d.Fingerprint == firstFingerprint
			e.SameFingerprint = &same
		}
		tl.addLinks(ev.Type, d.SupersedesOperationID, link)
		if ev.ToState.Final() {
			actor, at := ev.Actor, ev.CreatedAt
			tl.SettledBy, tl.SettledAt = &actor, &at
		}
		tl.Entries = append(tl.Entries, e)
	}
}

// addLinks records the operations an event of type evType links this one to: supersedes, what its claim said it
// supersedes, and link, its detail as a link.
func (tl *Timeline) addLinks(evType, supersedes string, link opstore.Link) {
	if supersedes != "" {
		tl.Supersedes = &supersedes
	}
	if link.SupersededBy != "" {
		tl.SupersededBy = append(tl.SupersededBy, link.SupersededBy)
	}
	// The link events are written by the services that make the links (payments, tickets), named by
	// their detail member.
	switch evType {
	case "remediates":
		tl.Remediates = nonEmpty(link.Remediates, tl.Remediates)
	case "remediated_by":
		tl.RemediatedBy = appendNonEmpty(tl.RemediatedBy, link.RemediatedBy)
	case "deduplicated_against":
		tl.DeduplicatedAgainst = nonEmpty(link.DeduplicatedAgainst, tl.DeduplicatedAgainst)
	case "deduplicated_by":
		tl.DeduplicatedBy = appendNonEmpty(tl.DeduplicatedBy, link.DeduplicatedBy)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// checkChain verifies the audit chain's records of operation id and of its approvals.
func checkChain(ctx context.Context, db database.Pool, accountID, id string, approvals []TimelineApproval) (ChainCheck, error) {
	subjects := make([]string, 0, len(approvals))
	for _, a := range approvals {
		subjects = append(subjects, a.ApprovalID)
	}
	rep, err := audit.Verify(ctx, db, audit.VerifyOptions{AccountID: accountID, OperationID: id, Subjects: subjects})
	if err != nil {
		return ChainCheck{}, fmt.Errorf("opstatus: timeline of %s: %w", id, err)
	}
	check := ChainCheck{Intact: rep.Intact(), Records: rep.Records, Sealed: rep.Sealed, Unsealed: rep.Unsealed,
		Seals: rep.Seals, Problems: []string{}}
	for _, p := range rep.Problems {
		check.Problems = append(check.Problems, p.String())
	}
	return check, nil
}

// timelineApprovals finds the approvals of op: the guard only lets a write use an approval of its own key, so
// both kinds are found on approvals_account_key.
func timelineApprovals(ctx context.Context, db database.DBTX, op Operation) ([]TimelineApproval, error) {
	rows, err := approvalsOf(ctx, db, op)
	if err != nil {
		return nil, fmt.Errorf("opstatus: approvals of %s: %w", op.ID, err)
	}
	out := make([]TimelineApproval, 0, len(rows))
	index := make(map[string]int, len(rows))
	for _, r := range rows {
		a := TimelineApproval{ApprovalID: r.ID, State: r.State, RequestedBy: r.RequestedBy, RequestedAt: r.CreatedAt,
			DecidedBy: r.DecidedBy, DecidedAt: r.DecidedAt, Records: []TimelineApprovalRecord{}}
		if r.UsedBy != nil {
			// The attempt whose claim used it: the approval names its operation, whose claim names the attempt.
			if a.UsedByAttempt, err = opstore.ClaimAttempt(ctx, db, op.AccountID, *r.UsedBy); err != nil {
				return nil, err
			}
		}
		index[r.ID] = len(out)
		out = append(out, a)
	}
	if len(out) == 0 {
		return out, nil
	}
	recs, err := approvalRecords(ctx, db, op.AccountID, keys(index))
	if err != nil {
		return nil, fmt.Errorf("opstatus: approval records of %s: %w", op.ID, err)
	}
	for _, r := range recs {
		a := &out[index[r.ApprovalID]]
		a.Records = append(a.Records, TimelineApprovalRecord{Seq: r.Seq, At: r.CreatedAt, Type: r.Type, Actor: r.Actor})
	}
	return out, nil
}

// approvalRow is an approval as the timeline reads it.
type approvalRow struct {
	ID          string
	State       string
	RequestedBy string
	CreatedAt   time.Time
	DecidedBy   *string
	DecidedAt   *time.Time
	UsedBy      *string
}

func approvalsOf(ctx context.Context, db database.DBTX, op Operation) ([]approvalRow, error) {
	return database.ScanAll(ctx, db, func(r *approvalRow) []any {
		return []any{&r.ID, &r.State, &r.RequestedBy, &r.CreatedAt, &r.DecidedBy, &r.DecidedAt, &r.UsedBy}
	}, `
SELECT a.id, a.state, a.requested_by, a.created_at, a.decided_by, a.decided_at, a.used_by_operation_id AS used_by
FROM approvals a
WHERE a.account_id = $1 AND a.idempotency_key = $2 AND (a.used_by_operation_id = $3 OR a.fingerprint = $4)
ORDER BY a.created_at, a.id`, op.AccountID, op.IdempotencyKey, op.ID, op.Fingerprint)
}

// approvalRecordRow is a record of an approval as the timeline reads it; Seq is its place in the approval's.
type approvalRecordRow struct {
	ApprovalID string
	Seq        int64
	Type       string
	Actor      string
	CreatedAt  time.Time
}

func approvalRecords(ctx context.Context, db database.DBTX, accountID string, approvals []string) ([]approvalRecordRow, error) {
	return database.ScanAll(ctx, db, func(r *approvalRecordRow) []any {
		return []any{&r.ApprovalID, &r.Seq, &r.Type, &r.Actor, &r.CreatedAt}
	}, `SELECT approval_id, row_number() OVER (PARTITION BY approval_id ORDER BY id) AS seq, type, actor, created_at
FROM approval_events WHERE account_id = $1 AND approval_id = ANY($2) ORDER BY approval_id, id`, accountID, approvals)
}

func nonEmpty(v string, old *string) *string {
	if v == "" {
		return old
	}
	return &v
}

func appendNonEmpty(list []string, v string) []string {
	if v == "" {
		return list
	}
	return append(list, v)
}

func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
