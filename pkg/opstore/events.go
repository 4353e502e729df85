package opstore

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/retrysafe/retrysafe/pkg/database"
)

// NewEvent is an event to write on an operation. From and To are set on an event that records a move of state.
type NewEvent struct {
	Type     string
	From, To string
	Actor    string
	// Detail is marshalled to JSON; nil is {}.
	Detail any
}

// Marshalled is e with its detail marshalled now, so that a detail that cannot be written fails here, not in
// the statement that writes it with others.
func (e NewEvent) Marshalled(opID string) (NewEvent, error) {
	raw, err := e.detailJSON(opID)
	if err != nil {
		return NewEvent{}, err
	}
	m := marshalled{raw: raw}
	m.attemptID, m.outcome = attemptColumns(e.Detail)
	e.Detail = m
	return e, nil
}

// marshalled is a detail already marshalled, with its columns.
type marshalled struct {
	raw                string
	attemptID, outcome *string
}

// detailJSON is e's detail as JSON text, {} for none.
func (e NewEvent) detailJSON(opID string) (string, error) {
	if m, ok := e.Detail.(marshalled); ok {
		return m.raw, nil
	}
	if e.Detail == nil {
		return "{}", nil
	}
	raw, err := json.Marshal(e.Detail)
	if err != nil {
		return "", fmt.Errorf("opstore: event of %s: detail: %w", opID, err)
	}
	if string(raw) == "null" {
		return "{}", nil
	}
	return string(raw), nil
}

// Appended is an event appended to operation ID of AccountID (Append, AppendAll).
type Appended struct {
	AccountID, ID string
	Event         NewEvent
}

// Append adds e, an event that changes no state, to operation id of account. The operation may not be inserted
// yet (a local write's is, at the end of its transaction, package idem): the events' foreign key, checked at
// COMMIT, refuses an event of an operation that never is.
func Append(ctx context.Context, db database.DBTX, accountID, id string, e NewEvent) error {
	return AppendAll(ctx, db, []Appended{{AccountID: accountID, ID: id, Event: e}})
}

// AppendAll adds events that change no state, in order, in one statement (append_events.sql): an attempt record
// whose attempt id its operation has already fails it whole (AttemptUsed).
func AppendAll(ctx context.Context, db database.DBTX, events []Appended) error {
	n := len(events)
	accounts, ids, types, actors, details := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	attempts, outcomes := make([]*string, n), make([]*string, n)
	for i, a := range events {
		raw, err := a.Event.detailJSON(a.ID)
		if err != nil {
			return err
		}
		accounts[i], ids[i], types[i], actors[i], details[i] = a.AccountID, a.ID, a.Event.Type, a.Event.Actor, raw
		attempts[i], outcomes[i] = attemptColumns(a.Event.Detail)
	}
	if _, err := exec(ctx, db, appendEventsSQL, accounts, ids, types, actors, details, attempts, outcomes); err != nil {
		if n == 1 {
			return fmt.Errorf("opstore: append to %s: %w", ids[0], err)
		}
		return fmt.Errorf("opstore: append %d events to %s and others: %w", n, ids[0], err)
	}
	return nil
}

// StartDispatch appends e (dispatch_started) to operation id of account only while the operation is running,
// waiting for a transaction that holds its row; false when it is not running (nothing written).
func StartDispatch(ctx context.Context, db database.DBTX, accountID, id string, e NewEvent) (bool, error) {
	raw, err := e.detailJSON(id)
	if err != nil {
		return false, err
	}
	n, err := exec(ctx, db, startDispatchSQL, accountID, id, e.Type, e.Actor, raw)
	if err != nil {
		return false, fmt.Errorf("opstore: dispatch of %s: %w", id, err)
	}
	return n == 1, nil
}
