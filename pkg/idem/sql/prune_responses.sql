-- Stored responses past their retention: the response goes, the key stays (state 'expired') until its own
-- expiry, so a retry with it is answered from the operation and never runs again. Keys of running, queued and
-- unknown operations have no expiry yet. created_at < $1 (the retention ago) bounds the scan by its index.
UPDATE idempotency_keys k
SET state = 'expired', response_headers = NULL, response_body = NULL
FROM operations o
WHERE o.account_id = k.account_id AND o.id = k.operation_id AND o.state IN ('succeeded', 'failed', 'cancelled')
  AND k.state = 'completed' AND k.created_at < $1 AND k.response_expires_at < now()
