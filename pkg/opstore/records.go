package opstore

import (
	"context"
	"fmt"
	"time"

	"github.com/retrysafe/retrysafe/pkg/database"
)

// Records: the audit (pkg/audit) seals and verifies operation_events rows as they are stored. These functions
// read them for it, in (xid, id) order, the order the audit seals them in; a position is a record's (xid, id),
// its xid as text. The text is read under another name than xid: the statements order by xid, and an output
// column named xid would make that the text's order ("1000" before "999"), not the ids'.

// RecordTable is the table the records are in, by name (the audit's seal entries name it).
const RecordTable = "operation_events"

// Record is an operation_events row as stored: Detail is the jsonb's text, XID the transaction id's.
type Record struct {
	ID          int64
	XID         string
	AccountID   string
	OperationID string
	Type        string
	Actor       string
	Detail      string
	FromState   *string
	ToState     *string
	AttemptID   *string
	Outcome     *string
	CreatedAt   time.Time
}

// RecordNames names records by account, operation and id: the i-th record is (AccountIDs[i],
// OperationIDs[i], IDs[i]).
type RecordNames struct {
	AccountIDs   []string
	OperationIDs []string
	IDs          []int64
}

var (
	recordsAfterSQL        = statement("records_after")
	countAfterSQL          = statement("count_after")
	recordsOfSQL           = statement("records_of")
	recordsOfAccountSQL    = statement("records_of_account")
	allRecordsSQL          = statement("all_records")
	recordsNamedSQL        = statement("records_named")
	recordsNamedOrAfterSQL = statement("records_named_or_after")
)

// RecordsAfter returns at most limit records after position (xid, id) whose transaction ended before the
// statement's snapshot was taken: the next records the audit may seal.
func RecordsAfter(ctx context.Context, db database.DBTX, xid string, id int64, limit int) ([]Record, error) {
	var out []Record
	err := streamRecords(ctx, db, recordsAfterSQL, []any{xid, id, limit}, func(r Record) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// CountAfter returns how many records lie after position (xid, id) and the oldest one's created_at (nil when
// none does).
func CountAfter(ctx context.Context, db database.DBTX, xid string, id int64) (n int64, oldest *time.Time, err error) {
	if _, err := queryRow(ctx, db, countAfterSQL, []any{xid, id}, &n, &oldest); err != nil {
		return 0, nil, fmt.Errorf("opstore: records after %s/%d: %w", xid, id, err)
	}
	return n, oldest, nil
}

// RecordsOf passes to emit the records of operations ids, of account accountID unless it is "" (then found
// by operation id alone).
func RecordsOf(ctx context.Context, db database.DBTX, accountID string, ids []string, emit func(Record) error) error {
	if accountID == "" {
		return streamRecords(ctx, db, recordsOfSQL, []any{ids}, emit)
	}
	return streamRecords(ctx, db, recordsOfAccountSQL, []any{accountID, ids}, emit)
}

// AllRecords passes every record to emit.
func AllRecords(ctx context.Context, db database.DBTX, emit func(Record) error) error {
	return streamRecords(ctx, db, allRecordsSQL, nil, emit)
}

// NamedRecords passes to emit the records names names.
func NamedRecords(ctx context.Context, db database.DBTX, names RecordNames, emit func(Record) error) error {
	return streamRecords(ctx, db, recordsNamedSQL, []any{names.AccountIDs, names.OperationIDs, names.IDs}, emit)
}

// NamedRecordsOrAfter passes to emit the records names names and those after position (xid, id).
func NamedRecordsOrAfter(ctx context.Context, db database.DBTX, names RecordNames, xid string, id int64, emit func(Record) error) error {
	return streamRecords(ctx, db, recordsNamedOrAfterSQL, []any{names.AccountIDs, names.OperationIDs, names.IDs, xid, id}, emit)
}

// streamRecords passes each record query reads to emit, as it is read.
func streamRecords(ctx context.Context, db database.DBTX, query string, args []any, emit func(Record) error) error {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("opstore: records: %w", translate(err))
	}
	defer rows.Close()
	for rows.Next() {
		var r Record
		if err := rows.Scan(&r.ID, &r.XID, &r.AccountID, &r.OperationID, &r.Type, &r.Actor, &r.Detail, &r.FromState, &r.ToState,
			&r.AttemptID, &r.Outcome, &r.CreatedAt); err != nil {
			return fmt.Errorf("opstore: records: %w", err)
		}
		if err := emit(r); err != nil {
			return err
		}
	}
	return rows.Err()
}
