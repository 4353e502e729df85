-- The response of a running key, stored once, in the transaction that records its operation's outcome, with the
-- key's two expiries ($7 and $8 seconds from now: the response's retention, the key's lifetime).
WITH done AS (
    UPDATE idempotency_keys
    SET state = 'completed', response_status = $4, response_headers = $5::jsonb, response_body = $6, completed_at = now(),
        response_expires_at = now() + $7 * interval '1 second', key_expires_at = now() + $8 * interval '1 second'
    WHERE account_id = $1 AND idempotency_key = $2 AND operation_id = $3 AND state = 'running'
    RETURNING 1
)
-- No row means the key is not running under this operation: the statement fails (division by zero), so
-- PostgreSQL skips the COMMIT sent after it and nothing of the transaction stays.
SELECT 1 / count(*) FROM done
