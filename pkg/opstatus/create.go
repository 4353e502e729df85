package opstatus

import (
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// NewEvent is one of the first events of an operation being created (QueueCreate).
type NewEvent struct {
	Type  string
	From  State // empty for the first event
	To    State
	Actor string
	// Detail is marshalled to JSON; nil is {}.
	Detail map[string]any
}

// QueueCreate queues on b the insert of op (its id, account, kind, state, key, fingerprint, resource and lease)
// and of its first events, in order, as plain rows: the audit record seals them later (package audit). b must
// run in one transaction (database.Tx). An op with an idempotency key claims it (key_state running): when
// another operation of the account holds that key, the insert fails with a unique violation of operations_key
// (KeyTaken), after waiting for the holder's transaction if it is still open.
func QueueCreate(b *pgx.Batch, op Operation, events []NewEvent) error {
	types, froms, tos, actors, details := make([]string, len(events)), make([]*string, len(events)), make([]*string, len(events)),
		make([]string, len(events)), make([]string, len(events))
	for i, e := range events {
		raw, err := marshalDetail(op.ID, e.Detail)
		if err != nil {
			return err
		}
		types[i], froms[i], tos[i], actors[i], details[i] = e.Type, stateText(e.From), stateText(e.To), e.Actor, raw
	}
	resType, resID := op.Resource.columns()
	b.Queue(insertOperationSQL, op.ID, op.AccountID, op.Kind, op.State, op.IdempotencyKey, op.Fingerprint,
		resType, resID, op.LeaseExpiresAt)
	if len(events) > 0 {
		b.Queue(insertEventsSQL, op.ID, op.AccountID, types, froms, tos, actors, details)
	}
	return nil
}

const insertOperationSQL = `
INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id, lease_expires_at, key_state)
VALUES ($1, $2, $3, $4, nullif($5, ''), nullif($6, ''), $7, $8, $9, CASE WHEN $5 <> '' THEN 'running' END)`

// insertEventsSQL inserts events in the order given: their ids follow it, and so does the history.
const insertEventsSQL = `
INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail)
SELECT $1, $2, v.type, v.from_state, v.to_state, v.actor, v.detail::jsonb
FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) WITH ORDINALITY AS v(type, from_state, to_state, actor, detail, ord)
ORDER BY v.ord`

func stateText(s State) *string {
	if s == "" {
		return nil
	}
	t := string(s)
	return &t
}

// marshalDetail is the JSON of an event's detail, {} for none.
func marshalDetail(opID string, detail map[string]any) (string, error) {
	if detail == nil {
		return "{}", nil
	}
	raw, err := json.Marshal(detail)
	if err != nil {
		return "", fmt.Errorf("opstatus: event of %s: detail: %w", opID, err)
	}
	return string(raw), nil
}
