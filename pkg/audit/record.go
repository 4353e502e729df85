package audit

import (
	"encoding/json"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// OperationEvent is the hashed content of one operation_events record: the same fields, in JSON, as
// operation_event_record in migrations/00006_audit_chain.sql. Verify builds it from stored rows; a writer that
// starts a chain itself (NewOperationChain) builds it before the insert.
type OperationEvent struct {
	OperationID string
	AccountID   string
	Type        string
	Actor       string
	FromState   *string
	ToState     *string
	// Detail is the event's detail as JSON text (any key order: it is canonicalized).
	Detail json.RawMessage
	// Attempt numbers the attempt records of an operation (IsAttempt); nil for other events.
	Attempt   *int64
	CreatedAt time.Time
}

// Record is the record's content as hashed.
func (e OperationEvent) Record() map[string]any {
	return map[string]any{
		"account_id": e.AccountID, "actor": e.Actor, "attempt": e.Attempt, "created_at": auditchain.FormatTime(e.CreatedAt),
		"detail": e.Detail, "from_state": e.FromState, "operation_id": e.OperationID,
		"to_state": e.ToState, "type": e.Type,
	}
}

// IsAttempt reports whether an event with detail is an attempt record: one HTTP attempt at a write, whose detail
// has an attempt_id and an outcome (the SQL trigger's test, detail ? 'outcome' AND detail ? 'attempt_id').
func IsAttempt(detail map[string]any) bool {
	_, outcome := detail["outcome"]
	_, attempt := detail["attempt_id"]
	return outcome && attempt
}

// Link is where a record sits in its chain.
type Link struct {
	Seq      int64
	PrevHash string
	Hash     string
	// Attempt is the record's attempt number, nil when it is not an attempt record.
	Attempt *int64
}

// NewOperationChain links events as the first records of a new operation's chain, numbering the attempt records
// among them (attempts[i] says whether events[i] is one) as the database's trigger does, and returns each
// record's link and the number of attempts. The writer stores the records with these links and inserts the
// chain's head (audit_chain_heads: the last link, the attempt count) in the same transaction; that insert fails
// if the chain already exists, so a precomputed link can only ever start a chain. The trigger chains every record
// written without a hash (migration 00012).
func NewOperationChain(events []OperationEvent, attempts []bool) ([]Link, int64, error) {
	c := auditchain.Chain{}
	links := make([]Link, len(events))
	var n int64
	for i := range events {
		e := &events[i]
		c.Name = e.OperationID
		if attempts[i] {
			n++
			num := n
			e.Attempt = &num
		}
		rec, err := c.Append(e.Record())
		if err != nil {
			return nil, 0, err
		}
		links[i] = Link{Seq: rec.Seq, PrevHash: rec.Prev, Hash: rec.Hash, Attempt: e.Attempt}
	}
	return links, n, nil
}
