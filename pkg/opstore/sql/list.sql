-- The first page of an account's operations, unknown first, then newest first (operations_account_listing); in
-- state $2 and of kind $3 when they are not empty.
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
       lease_expires_at, created_at, updated_at, response_expires_at, key_expires_at
FROM operations
WHERE account_id = $1 AND ($2 = '' OR state = $2) AND ($3 = '' OR kind = $3)
ORDER BY unknown DESC, created_at DESC, id DESC LIMIT $4
