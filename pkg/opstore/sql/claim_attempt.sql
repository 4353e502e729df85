-- The attempt id an operation's claim names ('' when none).
SELECT coalesce(max(attempt_id), '') FROM operation_events
WHERE account_id = $1 AND operation_id = $2 AND type = 'claimed'
