package idem

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// The key store (the idempotency_keys table, written only here) and the few reads of operations the flow
// needs. The statements are in sql/.
var (
	//go:embed sql/lookup.sql
	lookupSQL string
	//go:embed sql/claim.sql
	claimSQL string
	//go:embed sql/complete.sql
	completeSQL string
	//go:embed sql/release.sql
	releaseSQL string
	//go:embed sql/prune_responses.sql
	pruneResponsesSQL string
	//go:embed sql/prune_keys.sql
	pruneKeysSQL string
	//go:embed sql/attempt_known.sql
	attemptKnownSQL string
	//go:embed sql/attempt_recorded.sql
	attemptRecordedSQL string
	//go:embed sql/lock_operation.sql
	lockOperationSQL string
	//go:embed sql/superseded.sql
	supersededSQL string
	//go:embed sql/claimed_supersedes.sql
	claimedSupersedesSQL string
)

// stored is a claimed key as read back.
type stored struct {
	fingerprint string
	operationID string
	// state is the key's: running, completed (response is set) or expired (the response was pruned).
	state    string
	response response
	// resource is the operation's, read once the response expired.
	resource *opstatus.Resource
	// opState is the state of the key's operation when the key was read.
	opState opstatus.State
}

func (s stored) completed() bool { return s.state == "completed" }
func (s stored) expired() bool   { return s.state == "expired" }

// response is what a completed key replays, byte for byte.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// keyRef names one key; lookup is what reading it found.
type keyRef struct{ account, key string }

type lookup struct {
	stored
	found bool
}

// lookupKeys reads keys in one round trip, one statement per distinct key (each keeps its generic plan).
func lookupKeys(ctx context.Context, db *gorm.DB, refs []keyRef) ([]lookup, error) {
	out := make([]lookup, len(refs))
	read := map[keyRef]*lookup{}
	b := &pgx.Batch{}
	for i, ref := range refs {
		if _, ok := read[ref]; ok {
			continue
		}
		l := &out[i]
		read[ref] = l
		b.Queue(lookupSQL, ref.account, ref.key).QueryRow(func(row pgx.Row) error {
			var resType, resID *string
			s := &l.stored
			err := row.Scan(&s.fingerprint, &s.operationID, &s.state, &s.response.Status, &s.response.Header,
				&s.response.Body, &s.opState, &resType, &resID)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if resType != nil && resID != nil {
				s.resource = &opstatus.Resource{Type: *resType, ID: *resID}
			}
			l.found = err == nil
			return err
		})
	}
	if err := database.Send(ctx, db, b); err != nil {
		return nil, fmt.Errorf("idem: lookup: %w", err)
	}
	for i, ref := range refs {
		out[i] = *read[ref] // a copy of a key asked twice shares its read
	}
	return out, nil
}

// queueClaim queues the claim of cl's key on b. When the key exists the batch fails with errKeyTaken.
func queueClaim(b *pgx.Batch, op opstatus.Operation) {
	b.Queue(claimSQL, op.AccountID, op.IdempotencyKey, op.Fingerprint, op.ID)
}

// errKeyTaken is a claim's failure on a key that exists.
var errKeyTaken = errors.New("idem: key already claimed")

// claimError turns a claim batch's error into errKeyTaken when it is the key's unique violation.
func claimError(err error) error {
	if problem.IsUniqueViolation(err, "idempotency_keys_pkey") {
		return errKeyTaken
	}
	return err
}

// Defaults of Handler.Retention and Handler.KeyLifetime.
const (
	DefaultRetention   = 72 * time.Hour
	DefaultKeyLifetime = 90 * 24 * time.Hour
)

// queueComplete queues the storing of resp on op's running key, kept for retention and the key for lifetime. When
// the key is not running under op the statement fails, and so does everything sent after it, COMMIT included.
func queueComplete(b *pgx.Batch, op opstatus.Operation, resp response, retention, lifetime time.Duration) {
	b.Queue(completeSQL, op.AccountID, op.IdempotencyKey, op.ID, resp.Status, resp.Header, resp.Body,
		retention.Seconds(), lifetime.Seconds())
}

// queueRelease queues the delete of op's running key, so a retry with it claims again. The batch fails with
// ErrAlreadySettled when the key is no longer running under op.
func queueRelease(b *pgx.Batch, op opstatus.Operation) {
	b.Queue(releaseSQL, op.AccountID, op.IdempotencyKey, op.ID).Exec(func(ct pgconn.CommandTag) error {
		if ct.RowsAffected() == 0 {
			return ErrAlreadySettled
		}
		return nil
	})
}

// prune drops the stored responses older than retention, and the keys older than lifetime, of final operations.
func prune(ctx context.Context, db *gorm.DB, retention, lifetime time.Duration) (responses, keys int64, err error) {
	now := time.Now()
	b := &pgx.Batch{}
	b.Queue(pruneResponsesSQL, now.Add(-retention)).Exec(func(ct pgconn.CommandTag) error { responses = ct.RowsAffected(); return nil })
	b.Queue(pruneKeysSQL, now.Add(-lifetime)).Exec(func(ct pgconn.CommandTag) error { keys = ct.RowsAffected(); return nil })
	if err := database.Send(ctx, db, b); err != nil {
		return 0, 0, fmt.Errorf("idem: prune: %w", err)
	}
	return responses, keys, nil
}
