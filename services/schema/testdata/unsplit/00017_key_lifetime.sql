-- +goose Up
-- A key outlives its stored response. Pruning after the retention removes the response (state 'expired'), not
-- the key: with its fingerprint and operation it is kept until key_expires_at, so it never runs twice while it
-- lives. Both expiries are set when the key completes (its operation's outcome is known); neither is indexed,
-- so the completion still updates the row in place: the pruner finds old keys by created_at, which bounds both.
ALTER TABLE idempotency_keys
    ADD COLUMN response_expires_at timestamptz,
    ADD COLUMN key_expires_at      timestamptz,
    DROP CONSTRAINT idempotency_keys_state_check,
    ADD CONSTRAINT idempotency_keys_state_check CHECK (state IN ('running', 'completed', 'expired'));
UPDATE idempotency_keys SET response_expires_at = completed_at + interval '72 hours',
                            key_expires_at      = completed_at + interval '90 days'
WHERE state = 'completed';

-- +goose Down
DELETE FROM idempotency_keys WHERE state = 'expired';
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_state_check,
    ADD CONSTRAINT idempotency_keys_state_check CHECK (state IN ('running', 'completed')),
    DROP COLUMN key_expires_at,
    DROP COLUMN response_expires_at;
