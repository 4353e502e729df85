-- The newest $3 events of an operation, oldest first, with their place in its history and attempt numbers.
SELECT * FROM (
    SELECT id, seq, attempt, type, from_state, to_state, actor, detail::text AS detail, created_at
    FROM operation_events_numbered WHERE account_id = $1 AND operation_id = $2 ORDER BY id DESC LIMIT $3) newest
ORDER BY id
