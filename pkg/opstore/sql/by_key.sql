-- The operations of an account started under a key, newest first, after the cursor ($3, $4) when $4 is not NULL:
-- the one holding the key (operations_key) and those that gave it up (operations_released_key).
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
       lease_expires_at, created_at, updated_at, response_expires_at, key_expires_at
FROM operations
WHERE account_id = $1 AND idempotency_key = $2 AND key_held AND ($4::text IS NULL OR (created_at, id) < ($3, $4))
UNION ALL
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
       lease_expires_at, created_at, updated_at, response_expires_at, key_expires_at
FROM operations
WHERE account_id = $1 AND idempotency_key = $2 AND NOT key_held AND ($4::text IS NULL OR (created_at, id) < ($3, $4))
ORDER BY created_at DESC, id DESC LIMIT $5
