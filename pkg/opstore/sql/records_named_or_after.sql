-- The operation_events records named by (account $1[i], operation $2[i], id $3[i]) and those after position
-- ($4, $5) in (xid, id) order, in that order.
SELECT id, xid::text AS xid_text, account_id, operation_id, type, actor, detail::text, from_state, to_state, attempt_id, outcome, created_at
FROM operation_events
WHERE (account_id, operation_id, id) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]))
    OR (xid, id) > ($4::xid8, $5)
ORDER BY xid, id
