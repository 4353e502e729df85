package opstatus

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/pkg/audit"
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
// and of its first events, in order. The events are linked here as the first records of the operation's audit
// chain, whose head is queued too (audit.StartOperationChain), so the database's chaining trigger has nothing to
// do for them. b must run in one transaction (database.Tx).
func QueueCreate(b *pgx.Batch, op Operation, events []NewEvent) error {
	at := time.Now().UTC().Truncate(time.Microsecond)
	records := make([]audit.OperationEvent, len(events))
	attempts := make([]bool, len(events))
	details := make([]string, len(events))
	for i, e := range events {
		detail := e.Detail
		if detail == nil {
			detail = map[string]any{}
		}
		raw, err := json.Marshal(detail)
		if err != nil {
			return fmt.Errorf("opstatus: create %s: detail: %w", op.ID, err)
		}
		details[i] = string(raw)
		records[i] = audit.OperationEvent{OperationID: op.ID, AccountID: op.AccountID, Type: e.Type, Actor: e.Actor,
			FromState: stateText(e.From), ToState: stateText(e.To), Detail: raw, CreatedAt: at}
		attempts[i] = audit.IsAttempt(detail)
	}
	var resType, resID *string
	if op.Resource != nil {
		resType, resID = &op.Resource.Type, &op.Resource.ID
	}
	b.Queue(insertOperationSQL, op.ID, op.AccountID, op.Kind, op.State, op.IdempotencyKey, op.Fingerprint,
		resType, resID, op.LeaseExpiresAt)
	links, err := audit.StartOperationChain(b, op.AccountID, records, attempts)
	if err != nil {
		return fmt.Errorf("opstatus: create %s: %w", op.ID, err)
	}
	types, froms, tos, actors := make([]string, len(records)), make([]*string, len(records)), make([]*string, len(records)), make([]string, len(records))
	attemptNos, seqs, prevs, hashes := make([]*int64, len(records)), make([]int64, len(records)), make([]string, len(records)), make([]string, len(records))
	for i, e := range records {
		types[i], froms[i], tos[i], actors[i] = e.Type, e.FromState, e.ToState, e.Actor
		attemptNos[i], seqs[i], prevs[i], hashes[i] = links[i].Attempt, links[i].Seq, links[i].PrevHash, links[i].Hash
	}
	b.Queue(insertLinkedEventsSQL, op.ID, op.AccountID, at, types, froms, tos, actors, details, attemptNos, seqs, prevs, hashes)
	return nil
}

const insertOperationSQL = `
INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id, lease_expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// insertLinkedEventsSQL inserts events with their links, in chain order: the chaining trigger runs only for
// events without one.
const insertLinkedEventsSQL = `
INSERT INTO operation_events (operation_id, account_id, created_at, type, from_state, to_state, actor, detail,
                              attempt, chain_seq, prev_hash, hash)
SELECT $1, $2, $3, v.type, v.from_state, v.to_state, v.actor, v.detail::jsonb, v.attempt, v.seq, v.prev_hash, v.hash
FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::text[])
    AS v(type, from_state, to_state, actor, detail, attempt, seq, prev_hash, hash)
ORDER BY v.seq`

func stateText(s State) *string {
	if s == "" {
		return nil
	}
	t := string(s)
	return &t
}
