package audit

import (
	"context"
	"encoding/json"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// source is a table of records and how the audit reads it. Every read but sealable is in (xid, id) order.
type source struct {
	table string
	// body is the content a record's hash covers: its fields, in JSON.
	body func(r recordRow) any
	// sealable reads at most limit records after from that may be sealed now (the sealable read, audit.go).
	sealable func(ctx context.Context, tx database.DBTX, from auditchain.Position, limit int) ([]recordRow, error)
	// pending counts the records after from, and gives the oldest one's created_at (nil when none is).
	pending func(ctx context.Context, tx database.DBTX, from auditchain.Position) (int64, *time.Time, error)
	// ofSubjects reads the records of subjects, of accountID unless it is "".
	ofSubjects func(ctx context.Context, tx database.DBTX, accountID string, subjects []string, emit func(recordRow) error) error
	// all reads every record.
	all func(ctx context.Context, tx database.DBTX, emit func(recordRow) error) error
	// named reads the records names names and, when after is set, those after it.
	named func(ctx context.Context, tx database.DBTX, names recordNames, after *auditchain.Position, emit func(recordRow) error) error
}

// recordNames names records of one table: the i-th is (accounts[i], subjects[i], ids[i]).
type recordNames struct {
	accounts, subjects []string
	ids                []int64
}

// The tables' names, as the seals' entries give them.
const (
	tableOperationEvents = opstore.RecordTable
	tableApprovalEvents  = "approval_events"
)

// sources are the tables of records, operation_events' first: the order a batch seals them in.
var sources = []source{
	{
		table: tableOperationEvents,
		body: func(r recordRow) any {
			return operationRecord{AccountID: r.AccountID, Actor: r.Actor, AttemptID: r.AttemptID, CreatedAt: auditchain.FormatTime(r.CreatedAt),
				Detail: json.RawMessage(r.Detail), FromState: r.FromState, OperationID: r.Subject, Outcome: r.Outcome, ToState: r.ToState,
				Type: r.Type}
		},
		sealable: sealableOperationRecords, pending: pendingOperationRecords, ofSubjects: operationRecordsOf,
		all: allOperationRecords, named: namedOperationRecords,
	},
	eventSource(tableApprovalEvents, "approval_id", func(r recordRow) any {
		return approvalRecord{AccountID: r.AccountID, Actor: r.Actor, ApprovalID: r.Subject,
			CreatedAt: auditchain.FormatTime(r.CreatedAt), Detail: json.RawMessage(r.Detail), Type: r.Type}
	}),
	grantSource,
}

// Operation records are read through their store, opstore, which owns operation_events.

func operationRow(r opstore.Record) recordRow {
	return recordRow{ID: r.ID, XID: r.XID, AccountID: r.AccountID, Subject: r.OperationID, Type: r.Type, Actor: r.Actor,
		Detail: r.Detail, FromState: r.FromState, ToState: r.ToState, AttemptID: r.AttemptID, Outcome: r.Outcome, CreatedAt: r.CreatedAt}
}

// operationRows passes each opstore.Record to emit as a recordRow.
func operationRows(emit func(recordRow) error) func(opstore.Record) error {
	return func(r opstore.Record) error { return emit(operationRow(r)) }
}

func sealableOperationRecords(ctx context.Context, tx database.DBTX, from auditchain.Position, limit int) ([]recordRow, error) {
	recs, err := opstore.RecordsAfter(ctx, tx, from.XID, from.ID, limit)
	if err != nil {
		return nil, err
	}
	rows := make([]recordRow, len(recs))
	for i, r := range recs {
		rows[i] = operationRow(r)
	}
	return rows, nil
}

func pendingOperationRecords(ctx context.Context, tx database.DBTX, from auditchain.Position) (int64, *time.Time, error) {
	return opstore.CountAfter(ctx, tx, from.XID, from.ID)
}

func operationRecordsOf(ctx context.Context, tx database.DBTX, accountID string, subjects []string, emit func(recordRow) error) error {
	return opstore.RecordsOf(ctx, tx, accountID, subjects, operationRows(emit))
}

func allOperationRecords(ctx context.Context, tx database.DBTX, emit func(recordRow) error) error {
	return opstore.AllRecords(ctx, tx, operationRows(emit))
}

func namedOperationRecords(ctx context.Context, tx database.DBTX, names recordNames, after *auditchain.Position, emit func(recordRow) error) error {
	n := opstore.RecordNames{AccountIDs: names.accounts, OperationIDs: names.subjects, IDs: names.ids}
	if after == nil {
		return opstore.NamedRecords(ctx, tx, n, operationRows(emit))
	}
	return opstore.NamedRecordsOrAfter(ctx, tx, n, after.XID, after.ID, operationRows(emit))
}

// Approval and grant records are the audit's own tables': each an events table with the same columns, its
// subject (approval_id, grant_id) the one that differs, read with the statements eventSource writes for it.

// eventSource is the source of an events table of the audit's own whose subject column is subject, its records
// hashed as body gives them. The transaction id is read as text under another name than xid: the statements order
// by xid, and an output column named xid would make that the text's order ("1000" before "999"), not the ids'.
func eventSource(table, subject string, body func(recordRow) any) source {
	columns := `SELECT id, xid::text AS xid_text, account_id, ` + subject + ` AS subject, type, actor, detail::text AS detail, created_at
FROM ` + table
	named := columns + ` WHERE (account_id, ` + subject + `, id) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]))`
	var (
		// The sealable read (audit.go).
		sealableSQL = columns + `
WHERE (xid, id) > ($1::xid8, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid, id
LIMIT $3`
		pendingSQL      = `SELECT count(*) AS count, min(created_at) AS oldest FROM ` + table + ` WHERE (xid, id) > ($1::xid8, $2)`
		ofSQL           = columns + ` WHERE ` + subject + ` = ANY($1) ORDER BY xid, id`
		ofAccountSQL    = columns + ` WHERE account_id = $1 AND ` + subject + ` = ANY($2) ORDER BY xid, id`
		allSQL          = columns + ` ORDER BY xid, id`
		namedSQL        = named + ` ORDER BY xid, id`
		namedOrAfterSQL = named + ` OR (xid, id) > ($4::xid8, $5) ORDER BY xid, id`
	)
	return source{
		table: table,
		body:  body,
		sealable: func(ctx context.Context, tx database.DBTX, from auditchain.Position, limit int) ([]recordRow, error) {
			return collectRows(ctx, tx, sealableSQL, from.XID, from.ID, limit)
		},
		pending: func(ctx context.Context, tx database.DBTX, from auditchain.Position) (int64, *time.Time, error) {
			return countAndOldest(ctx, tx, pendingSQL, from)
		},
		ofSubjects: func(ctx context.Context, tx database.DBTX, accountID string, subjects []string, emit func(recordRow) error) error {
			if accountID == "" {
				return streamRows(ctx, tx, ofSQL, []any{subjects}, emit)
			}
			return streamRows(ctx, tx, ofAccountSQL, []any{accountID, subjects}, emit)
		},
		all: func(ctx context.Context, tx database.DBTX, emit func(recordRow) error) error {
			return streamRows(ctx, tx, allSQL, nil, emit)
		},
		named: func(ctx context.Context, tx database.DBTX, names recordNames, after *auditchain.Position, emit func(recordRow) error) error {
			args := []any{names.accounts, names.subjects, names.ids}
			if after == nil {
				return streamRows(ctx, tx, namedSQL, args, emit)
			}
			return streamRows(ctx, tx, namedOrAfterSQL, append(args, after.XID, after.ID), emit)
		},
	}
}

// streamRows passes each recordRow q reads to emit, as it is read. q reads the columns recordColumns names.
func streamRows(ctx context.Context, tx database.DBTX, q string, args []any, emit func(recordRow) error) error {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var r recordRow
		if err := rows.Scan(&r.ID, &r.XID, &r.AccountID, &r.Subject, &r.Type, &r.Actor, &r.Detail, &r.CreatedAt); err != nil {
			return err
		}
		if err := emit(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

// collectRows is every recordRow q reads.
func collectRows(ctx context.Context, tx database.DBTX, q string, args ...any) ([]recordRow, error) {
	var out []recordRow
	err := streamRows(ctx, tx, q, args, func(r recordRow) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// countAndOldest reads q's one row: how many records there are after from, and the oldest one's created_at (nil
// when there is none).
func countAndOldest(ctx context.Context, tx database.DBTX, q string, from auditchain.Position) (n int64, oldest *time.Time, err error) {
	err = tx.QueryRowContext(ctx, q, from.XID, from.ID).Scan(&n, &oldest)
	return n, oldest, err
}
