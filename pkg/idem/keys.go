package idem

import (
	"context"
	_ "embed"
	"encoding/json"
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
	//go:embed sql/prune.sql
	pruneSQL string
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
	completed   bool
	// response is set once the key is completed.
	response *response
	// opState is the state of the key's operation when the key was read.
	opState opstatus.State
}

// response is what a completed key replays, byte for byte.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// lookupKey reads the key of (account, key); found is false when there is none.
func lookupKey(ctx context.Context, db *gorm.DB, account, key string) (s stored, found bool, err error) {
	b := &pgx.Batch{}
	b.Queue(lookupSQL, account, key).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			found = true
			var (
				state, opState *string
				status         *int
				header         *string
				body           []byte
			)
			if err := rows.Scan(&s.fingerprint, &s.operationID, &state, &status, &header, &body, &opState); err != nil {
				return err
			}
			if opState != nil {
				s.opState = opstatus.State(*opState)
			}
			if *state == "completed" && status != nil {
				s.completed = true
				s.response = &response{Status: *status, Body: body, Header: http.Header{}}
				if header != nil {
					if err := json.Unmarshal([]byte(*header), &s.response.Header); err != nil {
						return fmt.Errorf("stored headers: %w", err)
					}
				}
			}
		}
		return rows.Err()
	})
	if err := database.Send(ctx, db, b); err != nil {
		return stored{}, false, fmt.Errorf("idem: lookup: %w", err)
	}
	return s, found, nil
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

// queueComplete queues the storing of resp on op's running key.
func queueComplete(b *pgx.Batch, op opstatus.Operation, resp response) error {
	header, err := json.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("idem: complete: headers: %w", err)
	}
	b.Queue(completeSQL, op.AccountID, op.IdempotencyKey, op.ID, resp.Status, string(header), resp.Body).Exec(
		func(ct pgconn.CommandTag) error {
			if ct.RowsAffected() != 1 {
				return fmt.Errorf("idem: complete: %w", problem.NotFound("running idempotency key"))
			}
			return nil
		})
	return nil
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

// pruneKeys deletes completed keys of final operations finished before cutoff.
func pruneKeys(ctx context.Context, db *gorm.DB, cutoff time.Time) (int64, error) {
	var n int64
	b := &pgx.Batch{}
	b.Queue(pruneSQL, cutoff).Exec(func(ct pgconn.CommandTag) error { n = ct.RowsAffected(); return nil })
	if err := database.Send(ctx, db, b); err != nil {
		return 0, fmt.Errorf("idem: prune: %w", err)
	}
	return n, nil
}
