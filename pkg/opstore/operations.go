package opstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/retrysafe/retrysafe/pkg/database"
)

// Get returns operation id of account, without its events, or ErrNotFound.
func Get(ctx context.Context, db database.DBTX, accountID, id string) (Operation, error) {
	op, err := one(ctx, db, getOperationSQL, accountID, id)
	if err != nil && err != ErrNotFound {
		return Operation{}, fmt.Errorf("opstore: get %s: %w", id, err)
	}
	return op, err
}

// LockForDecision returns operation id of account locked FOR NO KEY UPDATE until tx ends, or ErrNotFound.
func LockForDecision(ctx context.Context, tx database.DBTX, accountID, id string) (Operation, error) {
	op, err := one(ctx, tx, lockForDecisionSQL, accountID, id)
	if err != nil && err != ErrNotFound {
		return Operation{}, fmt.Errorf("opstore: lock %s: %w", id, err)
	}
	return op, err
}

// Cursor is the place of an operation in a newest-first order.
type Cursor struct {
	At time.Time
	ID string
}

// ByKey returns at most limit operations of account started under key, newest first, after after when not nil.
func ByKey(ctx context.Context, db database.DBTX, accountID, key string, after *Cursor, limit int) ([]Operation, error) {
	var at *time.Time
	var id *string
	if after != nil {
		at, id = &after.At, &after.ID
	}
	ops, err := operations(ctx, db, byKeySQL, accountID, key, at, id, limit)
	if err != nil {
		return nil, fmt.Errorf("opstore: find by key: %w", err)
	}
	return ops, nil
}

// ListAfter is the place of the last operation of a page in List's order.
type ListAfter struct {
	Unknown   bool
	CreatedAt time.Time
	ID        string
}

// List returns at most limit operations of account, in state and of kind when they are not empty, unknown first
// and then newest first, after after when it is not nil.
func List(ctx context.Context, db database.DBTX, accountID, state, kind string, after *ListAfter, limit int) ([]Operation, error) {
	var ops []Operation
	var err error
	if after == nil {
		ops, err = operations(ctx, db, listSQL, accountID, state, kind, limit)
	} else {
		ops, err = operations(ctx, db, listAfterSQL, accountID, state, kind, limit, after.Unknown, after.CreatedAt, after.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("opstore: list: %w", err)
	}
	return ops, nil
}

// ListUnknown returns at most limit unknown operations of every account, longest unchanged first.
func ListUnknown(ctx context.Context, db database.DBTX, limit int) ([]Operation, error) {
	ops, err := operations(ctx, db, listUnknownSQL, limit)
	if err != nil {
		return nil, fmt.Errorf("opstore: list unknown: %w", err)
	}
	return ops, nil
}

// Event is a row of operation_events as an operation's history shows it: Seq its place there, Attempt its
// number among the attempt records (nil for another event), Detail its JSON text.
type Event struct {
	ID, Seq   int64
	Attempt   *int64
	Type      string
	FromState string
	ToState   string
	Actor     string
	Detail    json.RawMessage
	CreatedAt time.Time
}

// Events returns the newest limit events of operation id of account (all when limit is 0), oldest first, and how
// many older ones it left out.
func Events(ctx context.Context, db database.DBTX, accountID, id string, limit int) ([]Event, int64, error) {
	fetch := math.MaxInt32
	if limit > 0 {
		fetch = limit + 1 // one more tells whether any was left out
	}
	rows, err := db.QueryContext(ctx, eventsSQL, accountID, id, fetch)
	if err != nil {
		return nil, 0, fmt.Errorf("opstore: events of %s: %w", id, err)
	}
	defer rows.Close()
	evs := []Event{}
	for rows.Next() {
		var ev Event
		var from, to *string
		var detail string
		if err := rows.Scan(&ev.ID, &ev.Seq, &ev.Attempt, &ev.Type, &from, &to, &ev.Actor, &detail, &ev.CreatedAt); err != nil {
			return nil, 0, fmt.Errorf("opstore: events of %s: %w", id, err)
		}
		if from != nil {
			ev.FromState = *from
		}
		if to != nil {
			ev.ToState = *to
		}
		if detail != "" && detail != "{}" {
			ev.Detail = json.RawMessage(detail)
		}
		evs = append(evs, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("opstore: events of %s: %w", id, err)
	}
	var omitted int64
	if limit > 0 && len(evs) > limit {
		evs = evs[1:]
		var total int64
		if _, err := queryRow(ctx, db, countEventsSQL, []any{accountID, id}, &total); err != nil {
			return nil, 0, fmt.Errorf("opstore: events of %s: %w", id, err)
		}
		omitted = total - int64(limit)
	}
	return evs, omitted, nil
}

// ExtendLease moves the lease of operation id of account, queued or running, to until; false when the
// operation is in another state (nothing changed).
func ExtendLease(ctx context.Context, tx database.DBTX, accountID, id string, until time.Time) (bool, error) {
	n, err := exec(ctx, tx, extendLeaseSQL, accountID, id, until)
	if err != nil {
		return false, fmt.Errorf("opstore: extend lease of %s: %w", id, err)
	}
	return n == 1, nil
}

// Move is a change of state Transition makes.
type Move struct {
	// From are the states it moves from; To the state it moves to (an operation in To already is not moved).
	From []string
	To   string
	// ResourceType and ResourceID, when not nil, set the operation's resource.
	ResourceType, ResourceID *string
	// ClearLease clears the lease; else Lease, when not nil, sets it.
	ClearLease bool
	Lease      *time.Time
	// Event records the move (its From and To are the move's).
	Event NewEvent
}

// Transition makes m on operation id of account, with its event, in one statement; false when the operation is
// in none of m.From (nothing changed).
func Transition(ctx context.Context, tx database.DBTX, accountID, id string, m Move) (bool, error) {
	detail, err := m.Event.detailJSON(id)
	if err != nil {
		return false, err
	}
	attempt, outcome := attemptColumns(m.Event.Detail)
	var n int64
	if _, err := queryRow(ctx, tx, transitionSQL, []any{accountID, id, m.To, m.ResourceType, m.ResourceID, m.ClearLease,
		m.Lease, m.Event.Type, m.Event.Actor, m.From, detail, attempt, outcome}, &n); err != nil {
		return false, fmt.Errorf("opstore: transition %s to %s: %w", id, m.To, err)
	}
	return n == 1, nil
}

// ExpireLeases moves up to 100 queued or running operations whose lease ended before now to unknown, each with
// an event of type eventType by actor (the claiming attempt's record, outcome unknown with reason, when it had
// none), and returns them.
func ExpireLeases(ctx context.Context, db database.DBTX, now time.Time, eventType, actor, reason string) ([]Operation, error) {
	ops, err := operations(ctx, db, expireLeasesSQL, now, eventType, actor, reason)
	if err != nil {
		return nil, fmt.Errorf("opstore: expire leases: %w", err)
	}
	return ops, nil
}

// OwnerLockClass is the first key of every owner's advisory lock (pg_advisory_lock(int4, int4)), its id the
// second: "rsow" (opstatus.Owner).
const OwnerLockClass = 0x72736f77

// OwnerGone returns the owner marked on operation id's claim when no session holds its advisory lock and no call
// of the operation was started; gone is false otherwise (no owner marked, owner alive, or a call started). Read
// it in a transaction that holds the operation's row lock before acting on it: StartDispatch waits for that lock,
// so the answer cannot change before the transaction ends.
func OwnerGone(ctx context.Context, db database.DBTX, accountID, id string) (owner int64, gone bool, err error) {
	gone, err = queryRow(ctx, db, ownerGoneSQL, []any{accountID, id, OwnerLockClass}, &owner)
	if err != nil {
		return 0, false, fmt.Errorf("opstore: owner of %s: %w", id, err)
	}
	return owner, gone, nil
}

// LastDispatch is the type of the newest dispatch_* event of operation id, "" when it has none.
func LastDispatch(ctx context.Context, db database.DBTX, accountID, id string) (string, error) {
	var typ string
	if _, err := queryRow(ctx, db, lastDispatchSQL, []any{accountID, id}, &typ); err != nil {
		return "", fmt.Errorf("opstore: dispatch records of %s: %w", id, err)
	}
	return typ, nil
}

// ClaimAttempt is the attempt id operation id's claim names, "" when none.
func ClaimAttempt(ctx context.Context, db database.DBTX, accountID, id string) (string, error) {
	var attempt string
	if _, err := queryRow(ctx, db, claimAttemptSQL, []any{accountID, id}, &attempt); err != nil {
		return "", fmt.Errorf("opstore: claim of %s: %w", id, err)
	}
	return attempt, nil
}

// Prior is what an approver is shown of an operation a write would supersede: its intent (kind, idempotency key,
// the resource it acted on: "" when none), its state, the type of its newest dispatch_* event and the newest
// reason any of its events gives (nil when none).
type Prior struct {
	Kind, State                              string
	IdempotencyKey, ResourceType, ResourceID string
	Dispatch, Reason                         *string
}

// ReadPrior returns Prior of operation id of account; found is false when the account has no such operation.
func ReadPrior(ctx context.Context, db database.DBTX, accountID, id string) (p Prior, found bool, err error) {
	found, err = queryRow(ctx, db, priorSQL, []any{accountID, id}, &p.Kind, &p.State, &p.IdempotencyKey, &p.ResourceType, &p.ResourceID, &p.Dispatch, &p.Reason)
	if err != nil {
		return Prior{}, false, fmt.Errorf("opstore: operation %s: %w", id, err)
	}
	return p, found, nil
}

// LockKindState returns the kind and state of operation id of account, its row locked FOR UPDATE until tx ends;
// found is false when the account has no such operation.
func LockKindState(ctx context.Context, tx database.DBTX, accountID, id string) (kind, state string, found bool, err error) {
	found, err = queryRow(ctx, tx, lockKindStateSQL, []any{accountID, id}, &kind, &state)
	if err != nil {
		return "", "", false, fmt.Errorf("opstore: lock %s: %w", id, err)
	}
	return kind, state, found, nil
}

// LastEventDetail is the detail of the newest event of type eventType of operation id whose detail member list
// is a JSON array, nil when it has none.
func LastEventDetail(ctx context.Context, db database.DBTX, accountID, id, eventType, list string) (json.RawMessage, error) {
	var detail string
	found, err := queryRow(ctx, db, lastEventDetailSQL, []any{accountID, id, eventType, list}, &detail)
	if err != nil || !found {
		return nil, err
	}
	return json.RawMessage(detail), nil
}

// LinkedNotFailed is the first operation that an event of type eventType of operation id names in its detail
// member member, and that did not fail; "" when none.
func LinkedNotFailed(ctx context.Context, db database.DBTX, accountID, id, eventType, member string) (string, error) {
	var linked string
	if _, err := queryRow(ctx, db, linkedNotFailedSQL, []any{accountID, id, eventType, member}, &linked); err != nil {
		return "", fmt.Errorf("opstore: links of %s: %w", id, err)
	}
	return linked, nil
}

// Creator is the first operation of account of kind, other than except, that succeeded creating the resource
// (resourceType, resourceID) without itself recording an event of type duplicateEvent; "" when none.
func Creator(ctx context.Context, db database.DBTX, accountID, kind, resourceType, resourceID, except, duplicateEvent string) (string, error) {
	var id string
	if _, err := queryRow(ctx, db, creatorSQL, []any{accountID, kind, resourceType, except, resourceID, duplicateEvent}, &id); err != nil {
		return "", fmt.Errorf("opstore: creator of %s: %w", resourceID, err)
	}
	return id, nil
}

// ForResource is the first operation of account of kind that names the resource (resourceType, resourceID),
// whatever its state; "" when none does.
func ForResource(ctx context.Context, db database.DBTX, accountID, kind, resourceType, resourceID string) (string, error) {
	var id string
	if _, err := queryRow(ctx, db, forResourceSQL, []any{accountID, kind, resourceType, resourceID}, &id); err != nil {
		return "", fmt.Errorf("opstore: operation of %s: %w", resourceID, err)
	}
	return id, nil
}

// AccountOf is the account of operation id, known by its id alone, or "" when there is none. It reads every
// account's operations: an operator's tool asks it, never a request.
func AccountOf(ctx context.Context, db database.DBTX, id string) (string, error) {
	var account string
	if _, err := queryRow(ctx, db, accountOfSQL, []any{id}, &account); err != nil {
		return "", fmt.Errorf("opstore: account of %s: %w", id, err)
	}
	return account, nil
}

// UnknownCount is how many operations are unknown now, and for how many seconds the oldest has been.
func UnknownCount(ctx context.Context, db database.DBTX) (n int64, oldestSeconds float64, err error) {
	if _, err := queryRow(ctx, db, unknownCountSQL, nil, &n, &oldestSeconds); err != nil {
		return 0, 0, fmt.Errorf("opstore: unknown operations: %w", err)
	}
	return n, oldestSeconds, nil
}

// HasEvents reports whether operation id, known by its id alone, has any event.
func HasEvents(ctx context.Context, db database.DBTX, id string) (bool, error) {
	var has bool
	if _, err := queryRow(ctx, db, hasEventsSQL, []any{id}, &has); err != nil {
		return false, fmt.Errorf("opstore: events of %s: %w", id, err)
	}
	return has, nil
}
