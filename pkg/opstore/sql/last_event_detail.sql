-- The detail of an operation's newest event of type $3 whose detail member $4 is a JSON array.
SELECT detail::text FROM operation_events
WHERE account_id = $1 AND operation_id = $2 AND type = $3 AND jsonb_typeof(detail->$4) = 'array'
ORDER BY id DESC LIMIT 1
