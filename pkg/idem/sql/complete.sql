-- The response of a running key, stored once, in the transaction that records its operation's outcome.
UPDATE idempotency_keys
SET state = 'completed', response_status = $4, response_headers = $5::jsonb, response_body = $6, completed_at = now()
WHERE account_id = $1 AND idempotency_key = $2 AND operation_id = $3 AND state = 'running'
