-- For a retry naming its parent attempt (Retry-Of): whether the parent is an attempt of the operation that a
-- retry may follow: an attempt record not itself refused or rejected as a conflict, or the claim of the attempt
-- still running (its record is written when it ends). And whether this attempt's own id is already used in the
-- operation, by a claim or a record (attempt ids are unique per operation).
SELECT
    EXISTS (SELECT 1 FROM operation_events
            WHERE account_id = $1 AND operation_id = $2 AND attempt_id = $3
              AND (type = 'claimed' OR outcome NOT IN ('refused', 'conflict_rejected')))
        AS parent_known,
    EXISTS (SELECT 1 FROM operation_events
            WHERE account_id = $1 AND operation_id = $2 AND attempt_id = $4) AS attempt_used
