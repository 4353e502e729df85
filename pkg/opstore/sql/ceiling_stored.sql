-- The schema ceiling's read of the operation holding key $2 of account $1 (internal/bench/schemaceiling.go).
SELECT id, fingerprint, response_status, response_body FROM operations
WHERE account_id = $1 AND idempotency_key = $2 AND key_held
