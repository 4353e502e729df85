-- The schema ceiling's attempt record, a plain insert (internal/bench/schemaceiling.go).
INSERT INTO operation_events (operation_id, account_id, type, actor, detail)
VALUES ($1, $2, $3, 'agent:bench', $4::jsonb)
