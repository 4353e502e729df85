-- Frees a key whose effect was never sent, so a retry with it claims again; its operation stays, settled.
DELETE FROM idempotency_keys
WHERE account_id = $1 AND idempotency_key = $2 AND operation_id = $3 AND state = 'running'
