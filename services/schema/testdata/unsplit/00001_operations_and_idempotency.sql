-- +goose Up
-- Operations: one row per intended action, with the state a caller that timed out can ask about.
CREATE TABLE operations (
    id               text PRIMARY KEY,
    account_id       text        NOT NULL,
    kind             text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'unknown')),
    idempotency_key  text,
    fingerprint      text,
    resource_type    text,
    resource_id      text,
    -- While an external effect is in flight the operation holds a lease; when it expires the recovery worker
    -- marks the operation unknown and hands it to the reconciler of its kind.
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operations_account_key ON operations (account_id, idempotency_key);
CREATE INDEX operations_expired_leases ON operations (lease_expires_at) WHERE state IN ('queued', 'running');
CREATE INDEX operations_unknown ON operations (updated_at) WHERE state = 'unknown';

-- The append-only history of every operation: claimed, completed, replayed, conflict_rejected, failed,
-- state_changed, reconciled, ...
CREATE TABLE operation_events (
    id           bigserial PRIMARY KEY,
    operation_id text        NOT NULL REFERENCES operations (id),
    account_id   text        NOT NULL,
    type         text        NOT NULL,
    from_state   text,
    to_state     text,
    actor        text        NOT NULL,
    detail       jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operation_events_operation ON operation_events (operation_id, id);

-- +goose StatementBegin
CREATE FUNCTION operation_events_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'operation_events is append-only';
END
$$ LANGUAGE plpgsql;
-- +goose StatementEnd
CREATE TRIGGER operation_events_append_only BEFORE UPDATE OR DELETE ON operation_events
    FOR EACH ROW EXECUTE FUNCTION operation_events_append_only();

-- Idempotency keys: the claim on (account, key) and the stored response to replay.
CREATE TABLE idempotency_keys (
    account_id       text        NOT NULL,
    idempotency_key  text        NOT NULL,
    fingerprint      text        NOT NULL,
    -- Deferred: the claim is inserted first (it is what decides who goes on), its operation right after.
    operation_id     text        NOT NULL REFERENCES operations (id) DEFERRABLE INITIALLY DEFERRED,
    state            text        NOT NULL CHECK (state IN ('running', 'completed')),
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    PRIMARY KEY (account_id, idempotency_key)
);
CREATE INDEX idempotency_keys_completed ON idempotency_keys (completed_at) WHERE state = 'completed';

-- +goose Down
DROP TABLE idempotency_keys;
DROP TABLE operation_events;
DROP FUNCTION operation_events_append_only();
DROP TABLE operations;
