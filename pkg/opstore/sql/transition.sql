-- Moves an operation in one of the states $10 (and not in $3 already) to $3, with its event; returns the number
-- of events written (0 or 1). FOR NO KEY UPDATE, not FOR UPDATE: an event insert takes KEY SHARE on the operation
-- for its foreign key, which FOR UPDATE would make wait for this transaction. $6 clears the lease; else $7 sets it
-- when not NULL.
WITH prev AS (
    SELECT account_id, id, state FROM operations WHERE account_id = $1 AND id = $2 FOR NO KEY UPDATE
), op AS (
    UPDATE operations o
    SET state = $3, updated_at = now(),
        resource_type = COALESCE($4, o.resource_type), resource_id = COALESCE($5, o.resource_id),
        lease_expires_at = CASE WHEN $6 THEN NULL ELSE COALESCE($7, o.lease_expires_at) END
    FROM prev
    WHERE o.account_id = prev.account_id AND o.id = prev.id AND prev.state = ANY($10::text[]) AND prev.state <> $3
    RETURNING o.id, o.account_id, prev.state AS from_state, o.state AS to_state
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail, attempt_id, outcome)
    SELECT id, account_id, $8, from_state, to_state, $9, $11::jsonb, $12, $13 FROM op
    RETURNING 1
)
SELECT count(*) FROM ev
