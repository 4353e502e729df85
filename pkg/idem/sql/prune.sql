-- Completed keys older than the cutoff whose operation is final. Keys of running, queued and unknown operations
-- are kept whatever their age: their outcome is still owed to the caller. created_at < cutoff is implied by
-- completed_at < cutoff; it is there for the index on created_at.
DELETE FROM idempotency_keys k USING operations o
WHERE o.account_id = k.account_id AND o.id = k.operation_id AND k.state = 'completed'
  AND k.created_at < $1 AND k.completed_at < $1 AND o.state IN ('succeeded', 'failed', 'cancelled')
