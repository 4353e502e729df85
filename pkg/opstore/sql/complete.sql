-- The completion of an operation running (or unknown) under its key: its new state and resource, the key's
-- stored response and expiries, and the event that records it. It finds the operation by its primary key, never
-- by a join (a generic plan cached while the table was small would scan the table for the join's other side),
-- and takes no lock of its own (the row is the transaction's already). It changes no indexed column: a heap-only
-- update (migrations/00001_baseline.sql). An operation not running under its key any more is refused by
-- operation_settled (SQLSTATE RS001): the transaction fails, COMMIT included when it was sent after.
WITH prev AS (
    SELECT state FROM operations WHERE account_id = $1 AND id = $2
), op AS (
    UPDATE operations
    SET state = $3, resource_type = coalesce($4, resource_type), resource_id = coalesce($5, resource_id),
        lease_expires_at = NULL, updated_at = now(),
        key_state = 'completed', response_status = $6, response_headers = $7::jsonb, response_body = $8,
        completed_at = now(), response_expires_at = now() + $9 * interval '1 second',
        key_expires_at = now() + $10 * interval '1 second'
    WHERE account_id = $1 AND id = $2 AND key_state = 'running' AND state IN ('running', 'unknown')
    RETURNING account_id, id, (SELECT state FROM prev) AS from_state
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail, attempt_id, outcome)
    SELECT id, account_id, $11, from_state, $3, $12, $13::jsonb, $14, $15 FROM op
)
SELECT operation_settled(count(*)) FROM op
