-- A new operation (package idem's external claim, a service's own): $5, when not empty, is its idempotency key,
-- which it claims (key_state running). When another operation of the account holds the key the insert fails with
-- a unique violation of operations_key, after waiting for the holder's transaction if it is still open.
INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id, lease_expires_at, key_state)
VALUES ($1, $2, $3, $4, nullif($5, ''), nullif($6, ''), $7, $8, $9, CASE WHEN $5 <> '' THEN 'running' END)
