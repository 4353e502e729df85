-- The operation_events records of operations $1, in (xid, id) order.
SELECT id, xid::text AS xid_text, account_id, operation_id, type, actor, detail::text, from_state, to_state, attempt_id, outcome, created_at
FROM operation_events
WHERE operation_id = ANY($1::text[])
ORDER BY xid, id
