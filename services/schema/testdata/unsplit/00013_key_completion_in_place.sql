-- +goose Up
-- A key is inserted running by its claim and updated once with its response. The partial index on completed_at
-- (WHERE state = 'completed') made that update change indexed columns, so PostgreSQL could not update in place
-- (HOT): every completion wrote a second primary-key entry and a completed_at entry. Prune now finds old keys by
-- created_at (a key is created before it completes, so created_at < cutoff is implied by completed_at < cutoff,
-- which it still checks), an index the update never touches, and pages keep room for the completed version.
DROP INDEX idempotency_keys_completed;
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
ALTER TABLE idempotency_keys SET (fillfactor = 80);

-- +goose Down
ALTER TABLE idempotency_keys RESET (fillfactor);
DROP INDEX idempotency_keys_created;
CREATE INDEX idempotency_keys_completed ON idempotency_keys (completed_at) WHERE state = 'completed';
