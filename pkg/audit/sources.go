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
	{
		table: tableApprovalEvents,
		body: func(r recordRow) any {
			return approvalRecord{AccountID: r.AccountID, Actor: r.Actor, ApprovalID: r.Subject,
				CreatedAt: auditchain.FormatTime(r.CreatedAt), Detail: json.RawMessage(r.Detail), Type: r.Type}
		},
		sealable: sealableApprovalRecords, pending: pendingApprovalRecords, ofSubjects: approvalRecordsOf,
		all: allApprovalRecords, named: namedApprovalRecords,
	},
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

// Approval records are the audit's own table's. The transaction id is read as text under another name than xid:
// the statements order by xid, and an output column named xid would make that the text's order ("1000" before
// "999"), not the ids'.
const (
	// sealableApprovalsSQL is the sealable read (audit.go) of approval_events.
	sealableApprovalsSQL = `
SELECT id, xid::text AS xid_text, account_id, approval_id AS subject, type, actor, detail::text AS detail, created_at
FROM approval_events
WHERE (xid, id) > ($1::xid8, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid, id
LIMIT $3`
	pendingApprovalsSQL = `SELECT count(*) AS count, min(created_at) AS oldest FROM approval_events WHERE (xid, id) > ($1::xid8, $2)`
	approvalsOfSQL      = `
SELECT id, xid::text AS xid_text, account_id, approval_id AS subject, type, actor, detail::text AS detail, created_at
FROM approval_events WHERE approval_id = ANY($1) ORDER BY xid, id`
	approvalsOfAccountSQL = `
SELECT id, xid::text AS xid_text, account_id, approval_id AS subject, type, actor, detail::text AS detail, created_at
FROM approval_events WHERE account_id = $1 AND approval_id = ANY($2) ORDER BY xid, id`
	allApprovalsSQL = `
SELECT id, xid::text AS xid_text, account_id, approval_id AS subject, type, actor, detail::text AS detail, created_at
FROM approval_events ORDER BY xid, id`
	namedApprovalsSQL = `
SELECT id, xid::text AS xid_text, account_id, approval_id AS subject, type, actor, detail::text AS detail, created_at
FROM approval_events WHERE (account_id, approval_id, id) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]))
ORDER BY xid, id`
	namedOrAfterApprovalsSQL = `
SELECT id, xid::text AS xid_text, account_id, approval_id AS subject, type, actor, detail::text AS detail, created_at
FROM approval_events WHERE (account_id, approval_id, id) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]))
    OR (xid, id) > ($4::xid8, $5)
ORDER BY xid, id`
)

func sealableApprovalRecords(ctx context.Context, tx database.DBTX, from auditchain.Position, limit int) ([]recordRow, error) {
	return collectRows(ctx, tx, sealableApprovalsSQL, from.XID, from.ID, limit)
}

func pendingApprovalRecords(ctx context.Context, tx database.DBTX, from auditchain.Position) (int64, *time.Time, error) {
	return countAndOldest(ctx, tx, pendingApprovalsSQL, from)
}

func approvalRecordsOf(ctx context.Context, tx database.DBTX, accountID string, subjects []string, emit func(recordRow) error) error {
	if accountID == "" {
		return streamRows(ctx, tx, approvalsOfSQL, []any{subjects}, emit)
	}
	return streamRows(ctx, tx, approvalsOfAccountSQL, []any{accountID, subjects}, emit)
}

func allApprovalRecords(ctx context.Context, tx database.DBTX, emit func(recordRow) error) error {
	return streamRows(ctx, tx, allApprovalsSQL, nil, emit)
}

func namedApprovalRecords(ctx context.Context, tx database.DBTX, names recordNames, after *auditchain.Position, emit func(recordRow) error) error {
	args := []any{names.accounts, names.subjects, names.ids}
	if after == nil {
		return streamRows(ctx, tx, namedApprovalsSQL, args, emit)
	}
	return streamRows(ctx, tx, namedOrAfterApprovalsSQL, append(args, after.XID, after.ID), emit)
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
