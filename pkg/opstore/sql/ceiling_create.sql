-- The schema ceiling's create (internal/bench/schemaceiling.go): the benchmark's floor of the store's own rows,
-- not a path of the store. The operation (holding key $3, its response stored), its one event and ticket $9 in
-- one statement: the event and the ticket are inserted only if the operation was. A concurrent copy waits on
-- operations_key until the first commits, then inserts nothing.
WITH op AS (
    INSERT INTO operations (account_id, id, kind, state, idempotency_key, fingerprint, resource_type, resource_id,
                            key_state, response_status, response_headers, response_body, completed_at,
                            response_expires_at, key_expires_at)
    VALUES ($1, $2, 'tickets.create', 'succeeded', $3, $4, 'ticket', $5, 'completed', 201, $6::jsonb, $7, now(),
            now() + interval '72 hours', now() + interval '90 days')
    ON CONFLICT (account_id, idempotency_key) WHERE key_held DO NOTHING
    RETURNING account_id, id
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail)
    SELECT id, account_id, 'completed', 'running', 'succeeded', 'agent:bench', $8::jsonb FROM op
)
INSERT INTO tickets (id, account_id, project, title, description, priority, status, created_at, updated_at)
SELECT $9, account_id, $10, $11, '', $12, 'open', $13, $14 FROM op
