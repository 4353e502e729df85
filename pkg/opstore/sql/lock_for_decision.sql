-- One operation, locked for a person's decision: FOR NO KEY UPDATE, as transition.sql takes it, so the decision
-- and a reconciler settling the same operation wait for each other and the second finds it no longer unknown.
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
       lease_expires_at, created_at, updated_at, response_expires_at, key_expires_at
FROM operations WHERE account_id = $1 AND id = $2 FOR NO KEY UPDATE
