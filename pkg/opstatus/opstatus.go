// Package opstatus shows operations: one row per intended action, with a state and an append-only history of
// events, so a caller that timed out can ask what happened instead of guessing.
//
// Package idem decides and records through package opstore, which owns the tables. Here are what the rest of a
// service uses: Transition for a change of state (a deploy controller moving queued to running), Append for
// evidence that changes no state (a provider lookup, an approval check), the reads (Get, FindByKey, List,
// GetTimeline), the lock a person's decision takes (LockForDecision; package resolution records it), Routes for
// GET /v1/operations/{id} and GET /v1/operations?idempotency_key=K, and RecoveryWorker, which marks operations
// whose lease expired as unknown and hands them to the Reconciler registered for their kind.
//
// Writes take the caller's transaction as a database.DBTX (database.SQL of a gorm transaction, or a database.Tx's
// SQL), so an operation changes state in the same commit as the business row it describes (see the package
// example); GetTimeline and Routes take the pool, since the timeline checks the audit chain in a snapshot of its
// own.
package opstatus

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// State is where an operation stands.
type State string

const (
	StateQueued    State = "queued"
	StateRunning   State = "running"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
	StateUnknown   State = "unknown"
	// StateDuplicateEffect: the other side's records show the effect executed more than once. Final: nothing
	// retries it; correcting it is a new operation.
	StateDuplicateEffect State = "duplicate_effect_confirmed"
)

// Final reports whether no transition leaves s.
func (s State) Final() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled || s == StateDuplicateEffect
}

// Resource names what an operation created or acted on.
type Resource struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// columns is r as the operations table's resource_type and resource_id: NULL and NULL for none.
func (r *Resource) columns() (typ, id *string) {
	if r == nil {
		return nil, nil
	}
	return &r.Type, &r.ID
}

// Operation is one intended action of one account.
type Operation struct {
	ID             string     `json:"id"`
	AccountID      string     `json:"-"`
	Kind           string     `json:"kind"`
	State          State      `json:"state"`
	IdempotencyKey string     `json:"idempotency_key,omitempty"`
	Fingerprint    string     `json:"fingerprint,omitempty"`
	Resource       *Resource  `json:"resource"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// ResponseExpiresAt is when the stored response of the operation's idempotency key is pruned, and
	// KeyExpiresAt when the key itself is, after which the same key would run again; both are set once the
	// operation's outcome is stored, and absent until then (package idem).
	ResponseExpiresAt *time.Time `json:"response_expires_at,omitempty"`
	KeyExpiresAt      *time.Time `json:"key_expires_at,omitempty"`
	CreatedAt         time.Time  `json:"created_at"`
	UpdatedAt         time.Time  `json:"updated_at"`
	Events            []Event    `json:"events"`
	// EventsOmitted is how many older events Events leaves out: an operation read through the API carries its
	// newest MaxEvents (every retry adds one); its timeline has them all.
	EventsOmitted int64 `json:"events_omitted,omitempty"`
}

// MaxEvents is how many of an operation's newest events Get and FindByKey return.
const MaxEvents = 200

// Event is one entry of an operation's history. Events are never updated or deleted (a trigger enforces it).
type Event struct {
	ID int64 `json:"id"`
	// Seq is the event's place in the operation's history (1 for the first); Attempt numbers its attempt records
	// (one HTTP attempt at a write), in the same order.
	Seq       int64           `json:"seq"`
	Attempt   *int64          `json:"attempt,omitempty"`
	Type      string          `json:"type"`
	FromState State           `json:"from_state,omitempty"`
	ToState   State           `json:"to_state,omitempty"`
	Actor     string          `json:"actor"`
	Detail    json.RawMessage `json:"detail,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
}

// NewID returns a new operation id: "op_" and a time-ordered UUID.
func NewID() string {
	return ids.New("op_")
}

// TransitionOption narrows or enriches a Transition.
type TransitionOption func(*transition)

type transition struct {
	from     []State
	resource *Resource
	lease    *time.Time
	clear    bool
	event    string
	detail   any
}

// From allows the transition only from these states.
func From(states ...State) TransitionOption {
	return func(t *transition) { t.from = states }
}

// WithResource sets the operation's resource in the same statement.
func WithResource(r Resource) TransitionOption {
	return func(t *transition) { t.resource = &r }
}

// WithLease sets (or, with a zero time, clears) the lease.
func WithLease(until time.Time) TransitionOption {
	return func(t *transition) {
		if until.IsZero() {
			t.clear = true
			return
		}
		t.lease = &until
	}
}

// WithEvent names the event type (opstore.EventStateChanged by default) and its detail, marshalled as JSON.
func WithEvent(eventType string, detail any) TransitionOption {
	return func(t *transition) { t.event, t.detail = eventType, detail }
}

// Transition moves operation id of account to state to and appends an event, in one statement. It returns false, and
// changes nothing, when the operation is not in one of the From states, or is already in state to: repeating a
// transition records no second event. A final state is never left unless From names it.
func Transition(ctx context.Context, tx database.DBTX, accountID, id string, to State, actor string, opts ...TransitionOption) (bool, error) {
	t := transition{event: opstore.EventStateChanged}
	for _, o := range opts {
		o(&t)
	}
	from := t.from
	if len(from) == 0 {
		from = []State{StateQueued, StateRunning, StateUnknown}
	}
	m := opstore.Move{From: make([]string, len(from)), To: string(to), ClearLease: t.clear, Lease: t.lease,
		Event: opstore.NewEvent{Type: t.event, Actor: actor, Detail: t.detail}}
	for i, s := range from {
		m.From[i] = string(s)
	}
	m.ResourceType, m.ResourceID = t.resource.columns()
	return opstore.Transition(ctx, tx, accountID, id, m)
}

// Append adds an event to operation id of account that does not change the state (replayed, conflict_rejected,
// reconcile evidence, ...).
func Append(ctx context.Context, db database.DBTX, accountID, id, eventType, actor string, detail any) error {
	return opstore.Append(ctx, db, accountID, id, opstore.NewEvent{Type: eventType, Actor: actor, Detail: detail})
}

// operation is the store's row as an Operation, without its events.
func operation(r opstore.Operation) Operation {
	op := Operation{
		ID: r.ID, AccountID: r.AccountID, Kind: r.Kind, State: State(r.State),
		IdempotencyKey: r.IdempotencyKey, Fingerprint: r.Fingerprint,
		LeaseExpiresAt: r.LeaseExpiresAt, ResponseExpiresAt: r.ResponseExpiresAt, KeyExpiresAt: r.KeyExpiresAt,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Events: []Event{},
	}
	if r.ResourceType != nil && r.ResourceID != nil {
		op.Resource = &Resource{Type: *r.ResourceType, ID: *r.ResourceID}
	}
	return op
}

// Get returns operation id of account with its events. Returns an error matching problem.ErrNotFound if the
// operation does not exist in that account.
func Get(ctx context.Context, db database.DBTX, accountID, id string) (Operation, error) {
	r, err := opstore.Get(ctx, db, accountID, id)
	if errors.Is(err, opstore.ErrNotFound) {
		return Operation{}, problem.NotFound("operation")
	}
	if err != nil {
		return Operation{}, err
	}
	op := operation(r)
	if op.Events, op.EventsOmitted, err = events(ctx, db, accountID, op.ID, MaxEvents); err != nil {
		return Operation{}, err
	}
	return op, nil
}

// FindByKey returns the operations of account that were started under an idempotency key, newest first (at
// most 20).
func FindByKey(ctx context.Context, db database.DBTX, accountID, key string) ([]Operation, error) {
	return FindByKeyPage(ctx, db, accountID, key, page.Request{Limit: 19})
}

// FindByKeyPage is FindByKey for one page: at most p.Fetch() operations after p.After.
func FindByKeyPage(ctx context.Context, db database.DBTX, accountID, key string, p page.Request) ([]Operation, error) {
	var after *opstore.Cursor
	if p.After != nil {
		after = &opstore.Cursor{At: p.After.At, ID: p.After.ID}
	}
	rows, err := opstore.ByKey(ctx, db, accountID, key, after, p.Fetch())
	if err != nil {
		return nil, err
	}
	ops := make([]Operation, 0, len(rows))
	for _, r := range rows {
		op := operation(r)
		if op.Events, op.EventsOmitted, err = events(ctx, db, accountID, op.ID, MaxEvents); err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	return ops, nil
}

// events returns the newest limit events of operation opID (all when limit is 0), oldest first, and how many
// older ones it left out.
func events(ctx context.Context, db database.DBTX, accountID, opID string, limit int) ([]Event, int64, error) {
	rows, omitted, err := opstore.Events(ctx, db, accountID, opID, limit)
	if err != nil {
		return nil, 0, err
	}
	evs := make([]Event, len(rows))
	for i, r := range rows {
		evs[i] = Event{ID: r.ID, Seq: r.Seq, Attempt: r.Attempt, Type: r.Type, FromState: State(r.FromState),
			ToState: State(r.ToState), Actor: r.Actor, Detail: r.Detail, CreatedAt: r.CreatedAt}
	}
	return evs, omitted, nil
}
