-- Whether the attempt that claimed the operation already has its attempt record (the recovery worker writes one
-- when the lease runs out). Sent after the operation's row lock (lock_operation.sql), in the same batch: this
-- statement's snapshot is taken once the lock is held, so it sees a record committed by the worker it waited for.
SELECT EXISTS (
    SELECT 1 FROM operation_events
    WHERE account_id = $1 AND operation_id = $2 AND attempt_id = $3 AND outcome IS NOT NULL
)
