package idem

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// KeyState is where a claimed key stands: running until a response is stored, then completed.
type KeyState string

const (
	KeyRunning   KeyState = "running"
	KeyCompleted KeyState = "completed"
)

// Record is one claimed idempotency key.
type Record struct {
	AccountID   string
	Key         string
	Fingerprint string
	OperationID string
	State       KeyState
	// Response is set once the key is completed.
	Response *Response
	// OperationState is the state of the key's operation when the record was read.
	OperationState opstatus.State
	CreatedAt      time.Time
}

// Response is what a completed key replays, byte for byte.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Store keeps idempotency keys. Every method that writes takes the caller's transaction, so a claim, the
// business write and the stored response can commit together. The conformance suite in idemtest runs
// against every implementation.
type Store interface {
	// Claim inserts rec as a running key unless (account, key) already exists, in one atomic statement: of
	// many concurrent claims exactly one returns claimed=true. When the key exists, Claim returns the stored
	// record and claimed=false.
	Claim(ctx context.Context, tx *gorm.DB, rec Record) (stored Record, claimed bool, err error)
	// Lookup returns the record of (account, key). Returns an error matching problem.ErrNotFound if there is none.
	Lookup(ctx context.Context, db *gorm.DB, accountID, key string) (Record, error)
	// Complete stores the response of a running key. Returns an error matching problem.ErrNotFound if the key
	// is not running.
	Complete(ctx context.Context, tx *gorm.DB, accountID, key string, resp Response) error
	// Prune deletes completed keys finished before cutoff whose operation is final. Keys of running, queued
	// and unknown operations are kept whatever their age.
	Prune(ctx context.Context, db *gorm.DB, cutoff time.Time) (int64, error)
}

// PostgresStore is the Store on PostgreSQL (the idempotency_keys table of migrations/).
type PostgresStore struct{}

var _ Store = PostgresStore{}

type keyRow struct {
	AccountID       string
	IdempotencyKey  string
	Fingerprint     string
	OperationID     string
	State           KeyState
	ResponseStatus  *int
	ResponseHeaders *string
	ResponseBody    []byte
	OperationState  *string
	CreatedAt       time.Time
}

func (r keyRow) record() (Record, error) {
	rec := Record{
		AccountID: r.AccountID, Key: r.IdempotencyKey, Fingerprint: r.Fingerprint, OperationID: r.OperationID,
		State: r.State, CreatedAt: r.CreatedAt,
	}
	if r.OperationState != nil {
		rec.OperationState = opstatus.State(*r.OperationState)
	}
	if r.State == KeyCompleted && r.ResponseStatus != nil {
		resp := &Response{Status: *r.ResponseStatus, Body: r.ResponseBody, Header: http.Header{}}
		if r.ResponseHeaders != nil {
			if err := json.Unmarshal([]byte(*r.ResponseHeaders), &resp.Header); err != nil {
				return Record{}, fmt.Errorf("idem: stored headers: %w", err)
			}
		}
		rec.Response = resp
	}
	return rec, nil
}

// Claim implements Store with INSERT ... ON CONFLICT DO NOTHING on the primary key (account_id, key). A
// concurrent claimer waits on the row until the first transaction ends; if the first commits it gets the
// conflict, if it rolls back (local mode: the write failed or the process died) the key is free again and the
// waiting claim takes it.
func (PostgresStore) Claim(ctx context.Context, tx *gorm.DB, rec Record) (Record, bool, error) {
	for attempt := 0; attempt < 3; attempt++ {
		var inserted []keyRow
		err := tx.WithContext(ctx).Raw(`
INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, operation_id, state)
VALUES (?, ?, ?, ?, 'running')
ON CONFLICT (account_id, idempotency_key) DO NOTHING
RETURNING account_id, idempotency_key, fingerprint, operation_id, state, created_at`,
			rec.AccountID, rec.Key, rec.Fingerprint, rec.OperationID).Scan(&inserted).Error
		if err != nil {
			return Record{}, false, fmt.Errorf("idem: claim: %w", err)
		}
		if len(inserted) == 1 {
			r, err := inserted[0].record()
			return r, true, err
		}
		// The key exists and is committed; a new statement sees it.
		stored, err := PostgresStore{}.Lookup(ctx, tx, rec.AccountID, rec.Key)
		if err == nil {
			return stored, false, nil
		}
		if !problemIsNotFound(err) {
			return Record{}, false, err
		}
		// Pruned between the two statements: claim again.
	}
	return Record{}, false, fmt.Errorf("idem: claim: key vanished three times while claiming")
}

// Lookup implements Store.
func (PostgresStore) Lookup(ctx context.Context, db *gorm.DB, accountID, key string) (Record, error) {
	var rows []keyRow
	err := db.WithContext(ctx).Raw(`
SELECT k.account_id, k.idempotency_key, k.fingerprint, k.operation_id, k.state, k.response_status,
       k.response_headers::text AS response_headers, k.response_body, o.state AS operation_state, k.created_at
FROM idempotency_keys k LEFT JOIN operations o ON o.id = k.operation_id
WHERE k.account_id = ? AND k.idempotency_key = ?`, accountID, key).Scan(&rows).Error
	if err != nil {
		return Record{}, fmt.Errorf("idem: lookup: %w", err)
	}
	if len(rows) == 0 {
		return Record{}, problem.NotFound("idempotency key")
	}
	return rows[0].record()
}

// Complete implements Store.
func (PostgresStore) Complete(ctx context.Context, tx *gorm.DB, accountID, key string, resp Response) error {
	header, err := json.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("idem: complete: headers: %w", err)
	}
	res := tx.WithContext(ctx).Exec(`
UPDATE idempotency_keys
SET state = 'completed', response_status = ?, response_headers = ?::jsonb, response_body = ?, completed_at = now()
WHERE account_id = ? AND idempotency_key = ? AND state = 'running'`,
		resp.Status, string(header), resp.Body, accountID, key)
	if res.Error != nil {
		return fmt.Errorf("idem: complete: %w", res.Error)
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("idem: complete: %w", problem.NotFound("running idempotency key"))
	}
	return nil
}

// Prune implements Store.
func (PostgresStore) Prune(ctx context.Context, db *gorm.DB, cutoff time.Time) (int64, error) {
	res := db.WithContext(ctx).Exec(`
DELETE FROM idempotency_keys k USING operations o
WHERE o.id = k.operation_id AND k.state = 'completed' AND k.completed_at < ?
  AND o.state IN ('succeeded', 'failed', 'cancelled')`, cutoff)
	if res.Error != nil {
		return 0, fmt.Errorf("idem: prune: %w", res.Error)
	}
	return res.RowsAffected, nil
}
