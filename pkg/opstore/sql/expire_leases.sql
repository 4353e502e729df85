-- Moves up to 100 queued or running operations whose lease ended before $1 to unknown, with a lease_expired
-- event ($2, by $3), and returns them. When the attempt that claimed one has no attempt record yet (its process
-- died between the claim and the outcome), the event is that record: the claim's detail with outcome unknown,
-- reason $4 and the operation's fingerprint, so the attempt has its number.
WITH expired AS (
    SELECT account_id, id, state FROM operations
    WHERE state IN ('queued', 'running') AND lease_expires_at < $1
    ORDER BY lease_expires_at
    LIMIT 100
    FOR NO KEY UPDATE SKIP LOCKED
), op AS (
    UPDATE operations o SET state = 'unknown', updated_at = now()
    FROM expired WHERE o.account_id = expired.account_id AND o.id = expired.id
    RETURNING o.id, o.account_id, o.kind, o.state, o.idempotency_key, o.fingerprint, o.resource_type,
              o.resource_id, o.lease_expires_at, o.created_at, o.updated_at, o.response_expires_at, o.key_expires_at,
              expired.state AS from_state
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail, attempt_id, outcome)
    SELECT op.id, op.account_id, $2, op.from_state, op.state, $3,
           coalesce((c.detail - 'supersedes_operation_id' - 'owner')
                    || jsonb_build_object('outcome', 'unknown', 'reason', $4::text, 'fingerprint', op.fingerprint), '{}'::jsonb),
           c.attempt_id, CASE WHEN c.attempt_id IS NOT NULL THEN 'unknown' END
    FROM op LEFT JOIN LATERAL (
        SELECT c.detail, c.attempt_id FROM operation_events c
        WHERE c.account_id = op.account_id AND c.operation_id = op.id AND c.type = 'claimed' AND c.attempt_id IS NOT NULL
          AND NOT EXISTS (
            SELECT 1 FROM operation_events a
            WHERE a.account_id = op.account_id AND a.operation_id = op.id AND a.attempt_id = c.attempt_id
              AND a.outcome IS NOT NULL)
        LIMIT 1) c ON true
)
SELECT id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id, lease_expires_at,
       created_at, updated_at, response_expires_at, key_expires_at FROM op
