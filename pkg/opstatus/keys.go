package opstatus

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
)

// An operation started under an idempotency key holds that key (package idem): QueueCreate claims it,
// QueueComplete stores the key's response on the operation, QueueCreateCompleted inserts an operation already
// completed (a local write's, whose claim and outcome commit together), QueueRelease gives the key up before the
// effect was sent, PruneKeys drops responses and keys past their expiry. The operations table's key columns are
// written here only.

// ErrAlreadySettled: the operation is not running under its key any more (another worker recorded its outcome,
// or released it), so nothing was written; PostgreSQL skips whatever was sent after it, COMMIT included.
var ErrAlreadySettled = errors.New("opstatus: operation already settled")

// KeyTaken reports whether err is a claim's failure on a key another operation of the account holds.
func KeyTaken(err error) bool {
	return database.UniqueViolation(err, "operations_key")
}

// Completion is the outcome an operation's key stores: the operation's new state and resource, the event that
// records it, and the response a retry with the key replays, kept for Retention and the key for Lifetime.
type Completion struct {
	State    State
	Resource *Resource
	Event    NewEvent
	Status   int
	Header   http.Header
	Body     []byte
	// Retention and Lifetime count from the completion.
	Retention, Lifetime time.Duration
}

// QueueComplete queues on b the move of op, running or unknown and holding its key, to c.State, with c's event
// (its From is the state op was in) and c's response stored on the key. When op is not running under its key
// the batch fails with ErrAlreadySettled. op's row must be the transaction's own (inserted by it, or locked
// before this statement is sent), so the state it moves from is the one it is in.
func QueueComplete(b *pgx.Batch, op Operation, c Completion) error {
	detail, err := marshalDetail(op.ID, c.Event.Detail)
	if err != nil {
		return err
	}
	resType, resID := c.Resource.columns()
	b.Queue(completeSQL, op.AccountID, op.ID, c.State, resType, resID, c.Status, c.Header, c.Body,
		c.Retention.Seconds(), c.Lifetime.Seconds(), c.Event.Type, c.Event.Actor, detail).QueryRow(settledCheck)
	return nil
}

// completeSQL finds the operation by its primary key, never by a join (a generic plan cached while the table was
// small would scan the table for the join's other side), and takes no lock of its own (the row is the
// transaction's already). It changes no indexed column: a heap-only update (migrations/00001_baseline.sql).
const completeSQL = `
WITH prev AS (
    SELECT state FROM operations WHERE account_id = $1 AND id = $2
), op AS (
    UPDATE operations
    SET state = $3, resource_type = coalesce($4, resource_type), resource_id = coalesce($5, resource_id),
        lease_expires_at = NULL, updated_at = now(),
        key_state = 'completed', response_status = $6, response_headers = $7::jsonb, response_body = $8,
        completed_at = now(), response_expires_at = now() + $9 * interval '1 second',
        key_expires_at = now() + $10 * interval '1 second'
    WHERE account_id = $1 AND id = $2 AND key_state = 'running' AND state IN ('running', 'unknown')
    RETURNING account_id, id, (SELECT state FROM prev) AS from_state
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail)
    SELECT id, account_id, $11, from_state, $3, $12, $13::jsonb FROM op
)
SELECT 1 / count(*) FROM op` // no row: division by zero fails the batch (settledCheck)

// QueueCreateCompleted queues on b the insert of op in c.State, holding its key with c's response stored, and
// of c's event (from running: the event records the operation's start and its outcome). It is for a write whose
// operation, effect and response commit in one transaction, so that the operation is written once, never moved
// (docs/benchmarks.md). When another operation of the account holds the key the insert fails as QueueCreate's
// does (KeyTaken).
func QueueCreateCompleted(b *pgx.Batch, op Operation, c Completion) error {
	detail, err := marshalDetail(op.ID, c.Event.Detail)
	if err != nil {
		return err
	}
	resType, resID := c.Resource.columns()
	b.Queue(createCompletedSQL, op.AccountID, op.ID, op.Kind, c.State, op.IdempotencyKey, op.Fingerprint, resType, resID,
		c.Status, c.Header, c.Body, c.Retention.Seconds(), c.Lifetime.Seconds(), c.Event.Type, c.Event.Actor, detail)
	return nil
}

const createCompletedSQL = `
WITH op AS (
    INSERT INTO operations (account_id, id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
                            key_state, response_status, response_headers, response_body, completed_at,
                            response_expires_at, key_expires_at)
    VALUES ($1, $2, $3, $4, nullif($5, ''), nullif($6, ''), $7, $8,
            CASE WHEN $5 <> '' THEN 'completed' END, $9, $10::jsonb, $11, now(),
            now() + $12 * interval '1 second', now() + $13 * interval '1 second')
    RETURNING account_id, id
)
INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail)
SELECT id, account_id, $14, 'running', $4, $15, $16::jsonb FROM op`

// QueueRelease queues on b the cancellation of op, running and holding its key, with an event of type
// eventType (its detail, by actor), and the release of its key: a retry with the key claims it again. When op is
// not running under its key the batch fails with ErrAlreadySettled.
func QueueRelease(b *pgx.Batch, op Operation, eventType, actor string, detail map[string]any) error {
	raw, err := marshalDetail(op.ID, detail)
	if err != nil {
		return err
	}
	b.Queue(releaseSQL, op.AccountID, op.ID, eventType, actor, raw).QueryRow(settledCheck)
	return nil
}

const releaseSQL = `
WITH op AS (
    UPDATE operations SET state = 'cancelled', key_state = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE account_id = $1 AND id = $2 AND state = 'running' AND key_state = 'running'
    RETURNING account_id, id
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail)
    SELECT id, account_id, $3, 'running', 'cancelled', $4, $5::jsonb FROM op
)
SELECT 1 / count(*) FROM op`

// settledCheck reads the answer of completeSQL or releaseSQL: a division by zero is an operation no longer
// running under its key.
func settledCheck(row pgx.Row) error {
	var one int
	err := row.Scan(&one)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "22012" {
		return ErrAlreadySettled
	}
	return err
}

// PruneKeys drops the stored responses of final operations completed before retention ago whose own expiry has
// passed (the key stays, expired: a retry with it is answered from the operation and never runs again), and
// gives up the keys of those completed before lifetime ago whose expiry has passed (the same key would then run
// again). Keys of queued, running and unknown operations are kept whatever their age. The created_at bounds
// make the scans read only the old part of the table (operations_created, a BRIN index).
func PruneKeys(ctx context.Context, db *gorm.DB, retention, lifetime time.Duration) (responses, keys int64, err error) {
	now := time.Now()
	res := db.WithContext(ctx).Exec(`UPDATE operations SET key_state = 'expired', response_headers = NULL, response_body = NULL
WHERE key_state = 'completed' AND created_at < ? AND response_expires_at < now()
  AND state IN ('succeeded', 'failed', 'cancelled')`, now.Add(-retention))
	if res.Error != nil {
		return 0, 0, fmt.Errorf("opstatus: prune responses: %w", res.Error)
	}
	responses = res.RowsAffected
	res = db.WithContext(ctx).Exec(`UPDATE operations SET key_state = NULL, response_headers = NULL, response_body = NULL
WHERE key_state IN ('completed', 'expired') AND created_at < ? AND key_expires_at < now()
  AND state IN ('succeeded', 'failed', 'cancelled')`, now.Add(-lifetime))
	if res.Error != nil {
		return responses, 0, fmt.Errorf("opstatus: prune keys: %w", res.Error)
	}
	return responses, res.RowsAffected, nil
}

// keyPredecessorSQL finds, through operations_account_key, the newest operation started under the key before
// op (ids are time-ordered UUIDv7s, compared byte by byte whatever the database's collation) that completed and gave the key up at the end of its lifetime: key_state NULL with a
// completion, unlike a claim released before its effect was sent (no completion).
const keyPredecessorSQL = `SELECT id FROM operations
WHERE account_id = ? AND idempotency_key = ? AND id COLLATE "C" < ? AND key_state IS NULL AND completed_at IS NOT NULL
ORDER BY id COLLATE "C" DESC LIMIT 1`

// KeyPredecessor returns the newest operation of op's account started under op's idempotency key before op
// whose key outlived its lifetime and was given up (PruneKeys), or "" when there is none. The same key sent
// after its lifetime names a new action, so anything derived from the key for another system (a downstream
// Idempotency-Key) must then differ from what the predecessor sent; a retry within the lifetime, or a claim made
// again after a failover lost the first one, finds the same predecessor and derives the same.
func KeyPredecessor(ctx context.Context, db *gorm.DB, op Operation) (string, error) {
	if op.IdempotencyKey == "" {
		return "", nil
	}
	var ids []string
	if err := db.WithContext(ctx).Raw(keyPredecessorSQL, op.AccountID, op.IdempotencyKey, op.ID).Scan(&ids).Error; err != nil {
		return "", fmt.Errorf("opstatus: predecessor of %s under its key: %w", op.ID, err)
	}
	if len(ids) == 0 {
		return "", nil
	}
	return ids[0], nil
}
