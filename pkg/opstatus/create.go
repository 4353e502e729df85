package opstatus

import (
	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// NewEvent is one of the first events of an operation being created (QueueCreate).
type NewEvent struct {
	Type  string
	From  State // empty for the first event
	To    State
	Actor string
	// Detail is marshalled to JSON (nil is {}): an opstore.Attempt for the events of an attempt.
	Detail any
}

func (e NewEvent) store() opstore.NewEvent {
	return opstore.NewEvent{Type: e.Type, From: string(e.From), To: string(e.To), Actor: e.Actor, Detail: e.Detail}
}

// QueueCreate queues on b the insert of op (its id, account, kind, state, key, fingerprint, resource and lease)
// and of its first events, in order, as plain rows: the audit record seals them later (package audit). b must
// run in one transaction (database.Tx). An op with an idempotency key claims it (key_state running): when
// another operation of the account holds that key, the insert fails with a unique violation of operations_key
// (KeyTaken), after waiting for the holder's transaction if it is still open.
func QueueCreate(b *pgx.Batch, op Operation, events []NewEvent) error {
	evs := make([]opstore.NewEvent, len(events))
	for i, e := range events {
		evs[i] = e.store()
	}
	return opstore.QueueCreate(b, op.new(), evs)
}

// new is op as the store inserts it.
func (op Operation) new() opstore.New {
	resType, resID := op.Resource.columns()
	return opstore.New{ID: op.ID, AccountID: op.AccountID, Kind: op.Kind, State: string(op.State),
		IdempotencyKey: op.IdempotencyKey, Fingerprint: op.Fingerprint, ResourceType: resType, ResourceID: resID,
		LeaseExpiresAt: op.LeaseExpiresAt}
}
