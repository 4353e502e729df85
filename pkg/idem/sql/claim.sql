-- A plain INSERT on the primary key (account_id, idempotency_key): of concurrent claims exactly one inserts. A
-- claim that meets a key held by a transaction still running waits for it; if that one commits the claim fails
-- with a unique violation (and PostgreSQL skips what was sent after it), if it rolls back the claim takes the key.
INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, operation_id, state)
VALUES ($1, $2, $3, $4, 'running')
