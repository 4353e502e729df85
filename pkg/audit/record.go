package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// recordRow is a record as the audit reads it from its table; Subject is its operation or approval.
type recordRow struct {
	ID        int64
	XID       string
	AccountID string
	Subject   string
	Type      string
	Actor     string
	Detail    string
	FromState *string
	ToState   *string
	AttemptID *string
	Outcome   *string
	CreatedAt time.Time
}

// operationRecord is the hashed content of an operation_events record. Its place in the operation's history and
// its attempt number are not stored (operation_events_numbered reads them from the id order), and need not be:
// the entries of the seals hold the records' ids, so a reordering shows. Its attempt id and outcome, the columns
// that make it an attempt record, are hashed when it has them.
type operationRecord struct {
	AccountID   string          `json:"account_id"`
	Actor       string          `json:"actor"`
	AttemptID   *string         `json:"attempt_id,omitempty"`
	CreatedAt   string          `json:"created_at"`
	Detail      json.RawMessage `json:"detail"`
	FromState   *string         `json:"from_state"`
	OperationID string          `json:"operation_id"`
	Outcome     *string         `json:"outcome,omitempty"`
	ToState     *string         `json:"to_state"`
	Type        string          `json:"type"`
}

// approvalRecord is the hashed content of an approval_events record.
type approvalRecord struct {
	AccountID  string          `json:"account_id"`
	Actor      string          `json:"actor"`
	ApprovalID string          `json:"approval_id"`
	CreatedAt  string          `json:"created_at"`
	Detail     json.RawMessage `json:"detail"`
	Type       string          `json:"type"`
}

// sealColumns reads a sealRow; sealHeaderColumns one without its entries (enough to link and extend the chain).
const (
	sealColumns = `seq, prev_hash, created_at, first_record, record_count, through::text AS through, records::text AS records,
records_hash, hash, signature`
	sealHeaderColumns = `seq, prev_hash, created_at, first_record, record_count, through::text AS through, NULL::text AS records,
records_hash, hash, signature`
)

type sealRow struct {
	Seq         int64
	PrevHash    string
	CreatedAt   time.Time
	FirstRecord int64
	RecordCount int64
	Through     string
	// Records is the entries' JSON text; nil when not read.
	Records     *string
	RecordsHash string
	Hash        string
	Signature   *string
}

// dest is where a row of sealColumns or sealHeaderColumns is scanned to, in their order.
func (r *sealRow) dest() []any {
	return []any{&r.Seq, &r.PrevHash, &r.CreatedAt, &r.FirstRecord, &r.RecordCount, &r.Through, &r.Records,
		&r.RecordsHash, &r.Hash, &r.Signature}
}

func (r sealRow) seal() (auditchain.Seal, error) {
	s := auditchain.Seal{Seq: r.Seq, Prev: r.PrevHash, At: r.CreatedAt, First: r.FirstRecord, Count: r.RecordCount,
		Records: r.RecordsHash, Hash: r.Hash}
	if r.Signature != nil {
		s.Signature = *r.Signature
	}
	if err := json.Unmarshal([]byte(r.Through), &s.Through); err != nil {
		return auditchain.Seal{}, fmt.Errorf("audit: seal %d: through: %w", r.Seq, err)
	}
	return s, nil
}

func insertSeal(ctx context.Context, tx database.DBTX, s auditchain.Seal, entries []auditchain.Entry) error {
	through, err := json.Marshal(s.Through)
	if err != nil {
		return err
	}
	records, err := json.Marshal(entries)
	if err != nil {
		return err
	}
	var sig *string
	if s.Signature != "" {
		sig = &s.Signature
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO audit_seals (seq, prev_hash, created_at, first_record, record_count, through, records, records_hash, hash, signature)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10)`,
		s.Seq, s.Prev, s.At, s.First, s.Count, string(through), string(records), s.Records, s.Hash, sig)
	return err
}
