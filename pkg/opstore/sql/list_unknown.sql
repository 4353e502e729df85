-- Unknown operations of every account, longest unchanged first (operations_unknown): the recovery worker's.
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
       lease_expires_at, created_at, updated_at, response_expires_at, key_expires_at
FROM operations WHERE unknown ORDER BY updated_at LIMIT $1
