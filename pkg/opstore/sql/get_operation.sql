-- One operation, by its whole key.
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
       lease_expires_at, created_at, updated_at, response_expires_at, key_expires_at
FROM operations WHERE account_id = $1 AND id = $2
