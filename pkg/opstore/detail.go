package opstore

// The details of the events the library writes, one type per kind, written and read by the same types. An event
// of another kind (a service's evidence) has a detail of its own, marshalled as JSON.
//
// An event's attempt id and outcome are also columns of operation_events, filled here from its detail (columns):
// the unique index operation_events_attempt and the numbering of attempt records (operation_events_numbered) read
// those columns, never JSON keys.

// Attempt is the detail of an event an HTTP attempt at a write causes: its claim, its attempt record (Outcome
// set: one number in the operation's attempts), or an event that names it (a release, a settlement).
type Attempt struct {
	AttemptID string `json:"attempt_id,omitempty"`
	// RepeatedAttemptID is the Attempt-Id of a refused attempt that repeated one the operation has: the id stays
	// the other attempt's.
	RepeatedAttemptID string `json:"repeated_attempt_id,omitempty"`
	AgentRunID        string `json:"agent_run_id,omitempty"`
	// GrantID is the grant the attempt was sent under (Grant-Id), checked and used by its claim.
	GrantID string `json:"grant_id,omitempty"`
	RetryOf string `json:"retry_of,omitempty"`
	// RetryReason is set, possibly empty, when RetryOf is.
	RetryReason *string `json:"retry_reason,omitempty"`
	// Outcome makes the event an attempt record: created, replayed, conflict_rejected, in_progress, unknown, ...
	Outcome     string `json:"outcome,omitempty"`
	Status      *int   `json:"status,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	DurationMS  *int64 `json:"duration_ms,omitempty"`
	// PriorFingerprint is the key's first request's, on a conflict; State the operation's, on an answer in progress.
	PriorFingerprint string `json:"prior_fingerprint,omitempty"`
	State            string `json:"state,omitempty"`
	// Refusal says why a retry's lineage headers were refused; Reason, from a fixed list, why the operation ended
	// as it did (a problem's code, lease_too_short, owner_gone, no_definite_answer).
	Refusal     string `json:"refusal,omitempty"`
	Reason      string `json:"reason,omitempty"`
	LeaseLeftMS *int64 `json:"lease_left_ms,omitempty"`
	// SupersedesOperationID is what the claim said it supersedes; Owner, the claiming process's owner lock.
	SupersedesOperationID string `json:"supersedes_operation_id,omitempty"`
	Owner                 int64  `json:"owner,omitempty"`
}

// Link is the detail of an event that links two operations of an account: the later one that supersedes it
// (by an attempt of the later), the duplicate a correction remediates or its correction, the operation that
// created what a request deduplicated against or one that deduplicated against it.
type Link struct {
	SupersededBy        string `json:"superseded_by,omitempty"`
	AttemptID           string `json:"attempt_id,omitempty"`
	Remediates          string `json:"remediates_operation_id,omitempty"`
	RemediatedBy        string `json:"remediated_by,omitempty"`
	DeduplicatedAgainst string `json:"deduplicated_against,omitempty"`
	DeduplicatedBy      string `json:"deduplicated_by,omitempty"`
	TicketID            string `json:"ticket_id,omitempty"`
}

// attemptColumns is a detail's attempt id and outcome as operation_events' columns: NULL for none.
func attemptColumns(detail any) (attemptID, outcome *string) {
	switch d := detail.(type) {
	case marshalled:
		return d.attemptID, d.outcome
	case Attempt:
		return nonEmpty(d.AttemptID), nonEmpty(d.Outcome)
	case *Attempt:
		return nonEmpty(d.AttemptID), nonEmpty(d.Outcome)
	case Link:
		return nonEmpty(d.AttemptID), nil
	case *Link:
		return nonEmpty(d.AttemptID), nil
	}
	return nil, nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
