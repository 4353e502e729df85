-- The type of an operation's newest dispatch record: dispatch_started while its call is out, what the caller
-- observed once it ended.
SELECT type FROM operation_events
WHERE account_id = $1 AND operation_id = $2 AND type LIKE 'dispatch\_%'
ORDER BY id DESC LIMIT 1
