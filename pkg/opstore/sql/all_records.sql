-- Every operation_events record, in (xid, id) order.
SELECT id, xid::text AS xid_text, account_id, operation_id, type, actor, detail::text, from_state, to_state, attempt_id, outcome, created_at
FROM operation_events
ORDER BY xid, id
