-- A later page of list.sql: the operations after the cursor ($5, $6, $7) in its order, a keyset on
-- operations_account_listing, so the hundredth page costs what the first does.
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
       lease_expires_at, created_at, updated_at, response_expires_at, key_expires_at
FROM operations
WHERE account_id = $1 AND ($2 = '' OR state = $2) AND ($3 = '' OR kind = $3)
  AND (unknown, created_at, id) < ($5, $6, $7)
ORDER BY unknown DESC, created_at DESC, id DESC LIMIT $4
