package opstatus

import (
	"context"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// An operation started under an idempotency key holds that key (package idem): QueueCreate claims it,
// QueueComplete stores the key's response on the operation, QueueCreateCompleted inserts an operation already
// completed (a local write's, whose claim and outcome commit together), QueueRelease gives the key up before the
// effect was sent, PruneKeys drops responses and keys past their expiry. The statements are package opstore's.

// ErrAlreadySettled: the operation is not running under its key any more (another worker recorded its outcome,
// or released it), so nothing was written; PostgreSQL skips whatever was sent after it, COMMIT included.
var ErrAlreadySettled = opstore.ErrAlreadySettled

// KeyTaken reports whether err is a claim's failure on a key another operation of the account holds.
func KeyTaken(err error) bool { return opstore.KeyTaken(err) }

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

func (c Completion) store() opstore.Completion {
	resType, resID := c.Resource.columns()
	return opstore.Completion{State: string(c.State), ResourceType: resType, ResourceID: resID, Event: c.Event.store(),
		Status: c.Status, Header: c.Header, Body: c.Body, Retention: c.Retention, Lifetime: c.Lifetime}
}

// QueueComplete queues on b the move of op, running or unknown and holding its key, to c.State, with c's event
// (its From is the state op was in) and c's response stored on the key. When op is not running under its key
// the batch fails with ErrAlreadySettled. op's row must be the transaction's own (inserted by it, or locked
// before this statement is sent), so the state it moves from is the one it is in.
func QueueComplete(b *pgx.Batch, op Operation, c Completion) error {
	return opstore.QueueComplete(b, op.AccountID, op.ID, c.store())
}

// QueueCreateCompleted queues on b the insert of op in c.State, holding its key with c's response stored, and
// of c's event (from running: the event records the operation's start and its outcome). It is for a write whose
// operation, effect and response commit in one transaction, so that the operation is written once, never moved
// (docs/benchmarks.md). When another operation of the account holds the key the insert fails as QueueCreate's
// does (KeyTaken).
func QueueCreateCompleted(b *pgx.Batch, op Operation, c Completion) error {
	return opstore.QueueCreateCompleted(b, op.new(), c.store())
}

// QueueRelease queues on b the cancellation of op, running and holding its key, with an event of type
// eventType (its detail, by actor), and the release of its key: a retry with the key claims it again. When op is
// not running under its key the batch fails with ErrAlreadySettled.
func QueueRelease(b *pgx.Batch, op Operation, eventType, actor string, detail any) error {
	return opstore.QueueRelease(b, op.AccountID, op.ID, NewEvent{Type: eventType, Actor: actor, Detail: detail}.store())
}

// PruneKeys drops the stored responses of final operations completed before retention ago whose own expiry has
// passed (the key stays, expired: a retry with it is answered from the operation and never runs again), and
// gives up the keys of those completed before lifetime ago whose expiry has passed (the same key would then run
// again). Keys of queued, running and unknown operations are kept whatever their age.
func PruneKeys(ctx context.Context, db *gorm.DB, retention, lifetime time.Duration) (responses, keys int64, err error) {
	now := time.Now()
	return opstore.Prune(ctx, db, now.Add(-retention), now.Add(-lifetime))
}

// KeyPredecessor returns the newest operation of op's account started under op's idempotency key before op
// whose key outlived its lifetime and was given up (PruneKeys), or "" when there is none. The same key sent
// after its lifetime names a new action, so anything derived from the key for another system (a downstream
// Idempotency-Key) must then differ from what the predecessor sent; a retry within the lifetime, or a claim made
// again after a failover lost the first one, finds the same predecessor and derives the same.
func KeyPredecessor(ctx context.Context, db *gorm.DB, op Operation) (string, error) {
	if op.IdempotencyKey == "" {
		return "", nil
	}
	return opstore.KeyPredecessor(ctx, db, op.AccountID, op.IdempotencyKey, op.ID)
}
