-- A local write's operation, inserted once, completed: holding its key ($5, when not empty) with the response
-- stored, and its one event, from running (it records the operation's start and its outcome). A key another
-- operation of the account holds fails the insert (operations_key).
WITH op AS (
    INSERT INTO operations (account_id, id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
                            key_state, response_status, response_headers, response_body, completed_at,
                            response_expires_at, key_expires_at)
    VALUES ($1, $2, $3, $4, nullif($5, ''), nullif($6, ''), $7, $8,
            CASE WHEN $5 <> '' THEN 'completed' END, $9, $10::jsonb, $11, now(),
            now() + $12 * interval '1 second', now() + $13 * interval '1 second')
    RETURNING account_id, id
)
INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail, attempt_id, outcome)
SELECT id, account_id, $14, 'running', $4, $15, $16::jsonb, $17, $18 FROM op
