package opstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// New is an operation to insert (QueueCreate). IdempotencyKey, when not empty, is claimed by the insert.
type New struct {
	ID, AccountID, Kind, State  string
	IdempotencyKey, Fingerprint string
	ResourceType, ResourceID    *string
	LeaseExpiresAt              *time.Time
}

// QueueCreate queues on b the insert of op and of its first events, in order, as plain rows (the audit record
// seals them later). b must run in one transaction (database.Tx). A key another operation of the account holds
// fails the insert (KeyTaken), after waiting for the holder's transaction if it is still open.
func QueueCreate(b *pgx.Batch, op New, events []NewEvent) error {
	n := len(events)
	types, froms, tos, actors, details := make([]string, n), make([]*string, n), make([]*string, n), make([]string, n), make([]string, n)
	attempts, outcomes := make([]*string, n), make([]*string, n)
	for i, e := range events {
		raw, err := e.detailJSON(op.ID)
		if err != nil {
			return err
		}
		types[i], froms[i], tos[i], actors[i], details[i] = e.Type, stateText(e.From), stateText(e.To), e.Actor, raw
		attempts[i], outcomes[i] = attemptColumns(e.Detail)
	}
	b.Queue(insertOperationSQL, op.ID, op.AccountID, op.Kind, op.State, op.IdempotencyKey, op.Fingerprint,
		op.ResourceType, op.ResourceID, op.LeaseExpiresAt)
	if n > 0 {
		b.Queue(insertEventsSQL, op.ID, op.AccountID, types, froms, tos, actors, details, attempts, outcomes)
	}
	return nil
}

// Completion is the outcome an operation's key stores: the operation's new state and resource, the event that
// records it (its From is the state the operation was in), and the response a retry with the key replays, kept
// for Retention and the key for Lifetime, counted from the completion.
type Completion struct {
	State                    string
	ResourceType, ResourceID *string
	Event                    NewEvent
	Status                   int
	Header                   http.Header
	Body                     []byte
	Retention, Lifetime      time.Duration
}

// QueueComplete queues on b the move of operation id of account, running or unknown and holding its key, to
// c.State, with c's event and c's response stored on the key. When the operation is not running under its key
// the batch fails with ErrAlreadySettled. Its row must be the transaction's own (inserted by it, or locked before
// this statement is sent), so the state it moves from is the one it is in.
func QueueComplete(b *pgx.Batch, accountID, id string, c Completion) error {
	detail, err := c.Event.detailJSON(id)
	if err != nil {
		return err
	}
	attempt, outcome := attemptColumns(c.Event.Detail)
	b.Queue(completeSQL, accountID, id, c.State, c.ResourceType, c.ResourceID, c.Status, c.Header, c.Body,
		seconds(c.Retention), seconds(c.Lifetime), c.Event.Type, c.Event.Actor, detail, attempt, outcome).QueryRow(settled)
	return nil
}

// QueueCreateCompleted queues on b the insert of op in c.State, holding its key with c's response stored, and of
// c's event (from running). A key another operation of the account holds fails the insert (KeyTaken).
func QueueCreateCompleted(b *pgx.Batch, op New, c Completion) error {
	detail, err := c.Event.detailJSON(op.ID)
	if err != nil {
		return err
	}
	attempt, outcome := attemptColumns(c.Event.Detail)
	b.Queue(createCompletedSQL, op.AccountID, op.ID, op.Kind, c.State, op.IdempotencyKey, op.Fingerprint, c.ResourceType,
		c.ResourceID, c.Status, c.Header, c.Body, seconds(c.Retention), seconds(c.Lifetime), c.Event.Type, c.Event.Actor, detail,
		attempt, outcome)
	return nil
}

// QueueRelease queues on b the cancellation of operation id of account, running and holding its key, with e (from
// running to cancelled), and the release of its key. When the operation is not running under its key the batch
// fails with ErrAlreadySettled.
func QueueRelease(b *pgx.Batch, accountID, id string, e NewEvent) error {
	detail, err := e.detailJSON(id)
	if err != nil {
		return err
	}
	attempt, outcome := attemptColumns(e.Detail)
	b.Queue(releaseSQL, accountID, id, e.Type, e.Actor, detail, attempt, outcome).QueryRow(settled)
	return nil
}

// settled reads the answer of complete.sql or release.sql.
func settled(row pgx.Row) error {
	var n int64
	return translate(row.Scan(&n))
}

// Prune drops the stored responses of final operations created before responsesBefore whose own expiry has
// passed at now (the key stays, expired), then gives up the keys of those created before keysBefore whose key
// expiry has passed at now. A nil now is the database's: the expiries were set by its clock (complete.sql).
func Prune(ctx context.Context, db database.DBTX, responsesBefore, keysBefore time.Time, now *time.Time) (responses, keys int64, err error) {
	if responses, err = exec(ctx, db, pruneResponsesSQL, responsesBefore, now); err != nil {
		return 0, 0, fmt.Errorf("opstore: prune responses: %w", err)
	}
	if keys, err = exec(ctx, db, pruneKeysSQL, keysBefore, now); err != nil {
		return responses, 0, fmt.Errorf("opstore: prune keys: %w", err)
	}
	return responses, keys, nil
}

// KeyPredecessor returns the newest operation of account started under key before operation id whose key
// outlived its lifetime and was given up (Prune), or "" when there is none (or key is ""). The same key sent
// after its lifetime names a new action, so anything derived from the key for another system (a downstream
// Idempotency-Key) must then differ from what the predecessor sent; a retry within the lifetime, or a claim made
// again after a failover lost the first one, finds the same predecessor and derives the same.
func KeyPredecessor(ctx context.Context, db database.DBTX, accountID, key, id string) (string, error) {
	if key == "" {
		return "", nil
	}
	var pred string
	if _, err := queryRow(ctx, db, keyPredecessorSQL, []any{accountID, key, id}, &pred); err != nil {
		return "", fmt.Errorf("opstore: predecessor of %s under its key: %w", id, err)
	}
	return pred, nil
}

// Key is a claimed key as read back (QueueLookupKey): the operation holding it, with what a retry needs.
type Key struct {
	Fingerprint, OperationID string
	// State is the key's: running, completed (the response is stored) or expired (it was pruned).
	State          string
	Status         int
	Header         http.Header
	Body           []byte
	OperationState string
	ResourceType   *string
	ResourceID     *string
}

// QueueLookupKey queues on b the read of key of account into k; found reports whether an operation holds it.
// Each read is one statement, by the unique index operations_key's whole key.
func QueueLookupKey(b *pgx.Batch, accountID, key string, k *Key, found *bool) {
	b.Queue(lookupKeySQL, accountID, key).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&k.Fingerprint, &k.OperationID, &k.State, &k.Status, &k.Header, &k.Body, &k.OperationState,
			&k.ResourceType, &k.ResourceID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		*found = err == nil
		return err
	})
}

// QueueKeyFree queues on b a local claim: the key's advisory lock, held until the transaction ends, then the key
// read again under it. The batch fails with taken when an operation holds the key.
func QueueKeyFree(b *pgx.Batch, accountID, key string, taken error) {
	b.Queue(lockKeySQL, accountID, key)
	b.Queue(lookupKeySQL, accountID, key).Query(func(rows pgx.Rows) error {
		if rows.Next() {
			return taken
		}
		return rows.Err()
	})
}

// QueueLock queues on b the lock of operation id's row (FOR NO KEY UPDATE) until the transaction ends.
func QueueLock(b *pgx.Batch, accountID, id string) {
	b.Queue(lockOperationSQL, accountID, id)
}

// QueueAttemptRecorded queues on b the read of whether attempt already has its attempt record in operation id,
// sent after its lock (QueueLock) in the same batch, so it sees a record committed by a worker it waited for.
func QueueAttemptRecorded(b *pgx.Batch, accountID, id, attempt string, recorded *bool) {
	b.Queue(attemptRecordedSQL, accountID, id, attempt).QueryRow(func(row pgx.Row) error { return row.Scan(recorded) })
}

// QueueShareState queues on b the read of operation id's state, its row held FOR SHARE until the transaction ends.
func QueueShareState(b *pgx.Batch, accountID, id string, state *string) {
	b.Queue(shareOperationSQL, accountID, id).QueryRow(func(row pgx.Row) error { return row.Scan(state) })
}

// Superseded is what a new operation needs of the one it says it supersedes.
type Superseded struct {
	Kind, State string
	// Superseded: another operation superseded it already.
	Superseded bool
}

// QueueSuperseded queues on b the read of operation id into s; the batch fails with pgx.ErrNoRows when the
// account has no such operation.
func QueueSuperseded(b *pgx.Batch, accountID, id string, s *Superseded) {
	b.Queue(supersededSQL, accountID, id).QueryRow(func(row pgx.Row) error { return row.Scan(&s.Kind, &s.State, &s.Superseded) })
}

// QueueClaimedSupersedes queues on b the read of the operation that operation id's claim said it supersedes
// ("" when none).
func QueueClaimedSupersedes(b *pgx.Batch, accountID, id string, supersedes *string) {
	b.Queue(claimedSupersedesSQL, accountID, id).QueryRow(func(row pgx.Row) error { return row.Scan(supersedes) })
}

// QueueAttemptKnown queues on b, for a retry of operation id naming its parent attempt parent: whether the parent
// is an attempt a retry may follow, and whether attempt, the retry's own id, is used in the operation already.
func QueueAttemptKnown(b *pgx.Batch, accountID, id, parent, attempt string, parentKnown, attemptUsed *bool) {
	b.Queue(attemptKnownSQL, accountID, id, parent, attempt).QueryRow(func(row pgx.Row) error {
		return row.Scan(parentKnown, attemptUsed)
	})
}
