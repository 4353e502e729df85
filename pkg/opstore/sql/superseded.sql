-- The operation a new one says it supersedes: its kind and state, and whether another operation already
-- superseded it.
SELECT o.kind, o.state, EXISTS (
    SELECT 1 FROM operation_events e
    WHERE e.account_id = o.account_id AND e.operation_id = o.id AND e.type = 'superseded'
) AS superseded
FROM operations o WHERE o.account_id = $1 AND o.id = $2
