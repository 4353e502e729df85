package audit

import (
	"context"
	"encoding/json"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// Grant records (grant_events: granted, used, revoked) are the audit's own table's, read as approval records are.

const tableGrantEvents = "grant_events"

// grantRecord is the hashed content of a grant_events record.
type grantRecord struct {
	AccountID string          `json:"account_id"`
	Actor     string          `json:"actor"`
	CreatedAt string          `json:"created_at"`
	Detail    json.RawMessage `json:"detail"`
	GrantID   string          `json:"grant_id"`
	Type      string          `json:"type"`
}

// The reads of grant_events, as those of approval_events (sources.go), in (xid, id) order but the sealable read's
// limit.
const (
	sealableGrantsSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events
WHERE (xid, id) > (?::xid8, ?) AND xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid, id
LIMIT ?`
	pendingGrantsSQL = `SELECT count(*) AS count, min(created_at) AS oldest FROM grant_events WHERE (xid, id) > (?::xid8, ?)`
	grantsOfSQL      = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events WHERE grant_id IN ? ORDER BY xid, id`
	grantsOfAccountSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events WHERE account_id = ? AND grant_id IN ? ORDER BY xid, id`
	allGrantsSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events ORDER BY xid, id`
	namedGrantsSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events WHERE (account_id, grant_id, id) IN (SELECT * FROM unnest(?::text[], ?::text[], ?::bigint[]))
ORDER BY xid, id`
	namedOrAfterGrantsSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events WHERE (account_id, grant_id, id) IN (SELECT * FROM unnest(?::text[], ?::text[], ?::bigint[]))
    OR (xid, id) > (?::xid8, ?)
ORDER BY xid, id`
)

// grantSource is the source of grant_events, sealed after operation_events and approval_events in a batch.
var grantSource = source{
	table: tableGrantEvents,
	body: func(r recordRow) any {
		return grantRecord{AccountID: r.AccountID, Actor: r.Actor, CreatedAt: auditchain.FormatTime(r.CreatedAt),
			Detail: json.RawMessage(r.Detail), GrantID: r.Subject, Type: r.Type}
	},
	sealable: func(ctx context.Context, tx *gorm.DB, from auditchain.Position, limit int) ([]recordRow, error) {
		var rows []recordRow
		err := tx.WithContext(ctx).Raw(sealableGrantsSQL, from.XID, from.ID, limit).Scan(&rows).Error
		return rows, err
	},
	pending: func(ctx context.Context, tx *gorm.DB, from auditchain.Position) (int64, *time.Time, error) {
		var row struct {
			Count  int64
			Oldest *time.Time
		}
		err := tx.WithContext(ctx).Raw(pendingGrantsSQL, from.XID, from.ID).Scan(&row).Error
		return row.Count, row.Oldest, err
	},
	ofSubjects: func(ctx context.Context, tx *gorm.DB, accountID string, subjects []string, emit func(recordRow) error) error {
		if accountID == "" {
			return streamRows(ctx, tx, grantsOfSQL, []any{subjects}, emit)
		}
		return streamRows(ctx, tx, grantsOfAccountSQL, []any{accountID, subjects}, emit)
	},
	all: func(ctx context.Context, tx *gorm.DB, emit func(recordRow) error) error {
		return streamRows(ctx, tx, allGrantsSQL, nil, emit)
	},
	named: func(ctx context.Context, tx *gorm.DB, names recordNames, after *auditchain.Position, emit func(recordRow) error) error {
		args := []any{textArray(names.accounts), textArray(names.subjects), int8Array(names.ids)}
		if after == nil {
			return streamRows(ctx, tx, namedGrantsSQL, args, emit)
		}
		return streamRows(ctx, tx, namedOrAfterGrantsSQL, append(args, after.XID, after.ID), emit)
	},
}
