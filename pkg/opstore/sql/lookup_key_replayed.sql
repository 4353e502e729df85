-- A retry's read of its key (lookup_key.sql) that also writes the retry's attempt record as a replay ($4 to $8,
-- the detail given the stored response's status) when that is the only answer the key can give: its response
-- stored, its fingerprint the retry's ($3), its operation not unknown. One statement, sent with the other reads
-- and committed with them before any answer is sent. The last column says whether the record was written.
WITH k AS (
    SELECT account_id, coalesce(fingerprint, '') AS fingerprint, id, key_state, coalesce(response_status, 0) AS status,
           coalesce(response_headers, '{}') AS headers, response_body, state, resource_type, resource_id
    FROM operations
    WHERE account_id = $1 AND idempotency_key = $2 AND key_held
), replayed AS (
    INSERT INTO operation_events (operation_id, account_id, type, actor, detail, attempt_id, outcome)
    SELECT id, account_id, $4, $5, $6::jsonb || jsonb_build_object('status', status), $7, $8 FROM k
    WHERE key_state = 'completed' AND fingerprint = $3 AND state <> 'unknown'
    RETURNING 1
)
SELECT fingerprint, id, key_state, status, headers, response_body, state, resource_type, resource_id,
       EXISTS (SELECT 1 FROM replayed)
FROM k
