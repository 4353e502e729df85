-- Keys past their lifetime, of final operations: only then may the same key run again. Keys of queued, running
-- and unknown operations are kept whatever their age. created_at < $1 (the lifetime ago) bounds the scan by its
-- index.
DELETE FROM idempotency_keys k USING operations o
WHERE o.account_id = k.account_id AND o.id = k.operation_id AND o.state IN ('succeeded', 'failed', 'cancelled')
  AND k.state IN ('completed', 'expired') AND k.created_at < $1 AND k.key_expires_at < now()
