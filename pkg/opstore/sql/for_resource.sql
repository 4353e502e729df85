-- The first operation of account $1 and kind $2 that names resource ($3, $4), whatever its state.
SELECT o.id FROM operations o
WHERE o.account_id = $1 AND o.kind = $2 AND o.resource_type = $3 AND o.resource_id = $4
ORDER BY o.created_at, o.id LIMIT 1
