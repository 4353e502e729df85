-- For a retry naming its parent attempt (Retry-Of): whether the parent is a recorded attempt of the operation
-- that a retry may follow (an attempt record, and not itself refused or rejected as a conflict), and whether this
-- attempt's own id is already recorded for the operation (attempt ids are unique per operation).
SELECT
    EXISTS (SELECT 1 FROM operation_events
            WHERE account_id = $1 AND operation_id = $2 AND is_attempt_record(detail) AND detail->>'attempt_id' = $3
              AND detail->>'outcome' NOT IN ('refused', 'conflict_rejected')) AS parent_known,
    EXISTS (SELECT 1 FROM operation_events
            WHERE account_id = $1 AND operation_id = $2 AND detail->>'attempt_id' = $4) AS attempt_used
