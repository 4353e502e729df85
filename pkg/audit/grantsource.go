package audit

import (
	"context"
	"encoding/json"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
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
WHERE (xid, id) > ($1::xid8, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid, id
LIMIT $3`
	pendingGrantsSQL = `SELECT count(*) AS count, min(created_at) AS oldest FROM grant_events WHERE (xid, id) > ($1::xid8, $2)`
	grantsOfSQL      = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events WHERE grant_id = ANY($1) ORDER BY xid, id`
	grantsOfAccountSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events WHERE account_id = $1 AND grant_id = ANY($2) ORDER BY xid, id`
	allGrantsSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events ORDER BY xid, id`
	namedGrantsSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events WHERE (account_id, grant_id, id) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]))
ORDER BY xid, id`
	namedOrAfterGrantsSQL = `
SELECT id, xid::text AS xid_text, account_id, grant_id AS subject, type, actor, detail::text AS detail, created_at
FROM grant_events WHERE (account_id, grant_id, id) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]))
    OR (xid, id) > ($4::xid8, $5)
ORDER BY xid, id`
)

// grantSource is the source of grant_events, sealed after operation_events and approval_events in a batch.
var grantSource = source{
	table: tableGrantEvents,
	body: func(r recordRow) any {
		return grantRecord{AccountID: r.AccountID, Actor: r.Actor, CreatedAt: auditchain.FormatTime(r.CreatedAt),
			Detail: json.RawMessage(r.Detail), GrantID: r.Subject, Type: r.Type}
	},
	sealable: func(ctx context.Context, tx database.DBTX, from auditchain.Position, limit int) ([]recordRow, error) {
		return collectRows(ctx, tx, sealableGrantsSQL, from.XID, from.ID, limit)
	},
	pending: func(ctx context.Context, tx database.DBTX, from auditchain.Position) (int64, *time.Time, error) {
		return countAndOldest(ctx, tx, pendingGrantsSQL, from)
	},
	ofSubjects: func(ctx context.Context, tx database.DBTX, accountID string, subjects []string, emit func(recordRow) error) error {
		if accountID == "" {
			return streamRows(ctx, tx, grantsOfSQL, []any{subjects}, emit)
		}
		return streamRows(ctx, tx, grantsOfAccountSQL, []any{accountID, subjects}, emit)
	},
	all: func(ctx context.Context, tx database.DBTX, emit func(recordRow) error) error {
		return streamRows(ctx, tx, allGrantsSQL, nil, emit)
	},
	named: func(ctx context.Context, tx database.DBTX, names recordNames, after *auditchain.Position, emit func(recordRow) error) error {
		args := []any{names.accounts, names.subjects, names.ids}
		if after == nil {
			return streamRows(ctx, tx, namedGrantsSQL, args, emit)
		}
		return streamRows(ctx, tx, namedOrAfterGrantsSQL, append(args, after.XID, after.ID), emit)
	},
}
