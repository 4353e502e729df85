-- The cancellation of an operation running under its key, before its effect was sent, with its event, and the
-- release of its key: a retry with the key claims it again. An operation not running under its key is refused
-- by operation_settled (SQLSTATE RS001).
WITH op AS (
    UPDATE operations SET state = 'cancelled', key_state = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE account_id = $1 AND id = $2 AND state = 'running' AND key_state = 'running'
    RETURNING account_id, id
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail, attempt_id, outcome)
    SELECT id, account_id, $3, 'running', 'cancelled', $4, $5::jsonb, $6, $7 FROM op
)
SELECT operation_settled(count(*)) FROM op
