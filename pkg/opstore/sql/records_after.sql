-- The audit's next operation_events records to seal: at most $3 after position ($1, $2) in (xid, id) order,
-- whose transaction ended before this statement's snapshot was taken (pkg/audit/audit.go, the sealable read, says
-- why none is ever skipped).
SELECT id, xid::text AS xid_text, account_id, operation_id, type, actor, detail::text, from_state, to_state, attempt_id, outcome, created_at
FROM operation_events
WHERE (xid, id) > ($1::xid8, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid, id
LIMIT $3
