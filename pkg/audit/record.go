package audit

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// OperationEvent is the hashed content of one operation_events record: the same fields, in JSON, as
// operation_event_record in migrations/00006_audit_chain.sql. Verify builds it from stored rows; a writer that
// links its records itself (ContinueOperationChain) builds it before the insert.
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

// record is the content hashed: the fields of operation_event_record in the migrations, in JSON. Verify
// builds it from stored rows; a writer that links its records itself builds it before the insert.
func (e OperationEvent) record() operationRecord {
	return operationRecord{AccountID: e.AccountID, Actor: e.Actor, Attempt: e.Attempt, CreatedAt: auditchain.FormatTime(e.CreatedAt),
		Detail: e.Detail, FromState: e.FromState, OperationID: e.OperationID, ToState: e.ToState, Type: e.Type}
}

type operationRecord struct {
	AccountID   string          `json:"account_id"`
	Actor       string          `json:"actor"`
	Attempt     *int64          `json:"attempt"`
	CreatedAt   string          `json:"created_at"`
	Detail      json.RawMessage `json:"detail"` // nil is null
	FromState   *string         `json:"from_state"`
	OperationID string          `json:"operation_id"`
	ToState     *string         `json:"to_state"`
	Type        string          `json:"type"`
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

// Head is where an operation's chain stands, as its row of audit_chain_heads keeps it: its last record (seq 0
// and no hash when the chain has none) and how many attempt records it holds.
type Head struct {
	Seq      int64
	Hash     string
	Attempts int64
}

// ContinueOperationChain links events, all of one operation, as the records that follow head in the operation's
// chain, numbering the attempt records among them (attempts[i] says whether events[i] is one) after head's count
// as the database's trigger does. It returns each record's link and the chain's attempt count after them.
//
// The writer stores the records with these links and moves the chain's head row to the last one in the same
// transaction, and must hold that row locked (SELECT ... FOR UPDATE) from the read of head to the commit:
// otherwise another writer could link its own records from the same head. The trigger chains every record
// written without a hash (migration 00012), so writers of both kinds share the head row and its lock.
func ContinueOperationChain(head Head, events []OperationEvent, attempts []bool) ([]Link, int64, error) {
	if len(events) == 0 {
		return nil, head.Attempts, nil
	}
	c := auditchain.Resume(auditchain.Head{Chain: events[0].OperationID, Seq: head.Seq, Hash: head.Hash})
	links := make([]Link, len(events))
	n := head.Attempts
	for i := range events {
		e := &events[i]
		if e.OperationID != c.Name {
			return nil, 0, fmt.Errorf("audit: one chain links the records of %s and %s", c.Name, e.OperationID)
		}
		if attempts[i] {
			n++
			num := n
			e.Attempt = &num
		}
		rec, err := c.Append(e.record())
		if err != nil {
			return nil, 0, err
		}
		links[i] = Link{Seq: rec.Seq, PrevHash: rec.Prev, Hash: rec.Hash, Attempt: e.Attempt}
	}
	return links, n, nil
}

// NewOperationChain is ContinueOperationChain for the first records of a new operation's chain. The writer
// inserts the chain's head (audit_chain_heads: the last link, the attempt count) in the same transaction; that
// insert fails if the chain already exists, so these links can only ever start a chain.
func NewOperationChain(events []OperationEvent, attempts []bool) ([]Link, int64, error) {
	return ContinueOperationChain(Head{}, events, attempts)
}
