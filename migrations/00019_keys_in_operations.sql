-- +goose Up
-- An idempotency key is a column of the operation it started: the claim inserts the operation, the completion
-- stores the response on it, in place. A local create writes three rows (its operation, one record, the service's
-- own row) where it wrote five. The idempotency_keys table goes.
--
-- key_state is the key's: running (claimed, no response yet), completed (the response is stored), expired (the
-- response was pruned; the key still never runs again), or NULL: the operation holds no key (it has none, its
-- claim was released before its effect was sent, or its key outlived its lifetime and was pruned). Of one
-- account's operations with one key, at most one holds it (key_held): the unique index operations_key. Every
-- operation started under a key, holding it or not, is found by operations_account_key.
--
-- A completion changes no indexed column, so PostgreSQL writes it as a heap-only update (HOT: no index entry
-- added): no index reads state, key_state or updated_at. The two facts the indexes need from them are generated
-- columns, which keep their value when an operation moves from running to succeeded: unknown (listing and the
-- recovery worker's scan) and key_held. Pruning scans by age with a BRIN index on created_at.
ALTER TABLE operations
    ADD COLUMN key_state           text CHECK (key_state IN ('running', 'completed', 'expired')),
    ADD COLUMN response_status     integer,
    ADD COLUMN response_headers    jsonb,
    ADD COLUMN response_body       bytea,
    ADD COLUMN completed_at        timestamptz,
    ADD COLUMN response_expires_at timestamptz,
    ADD COLUMN key_expires_at      timestamptz,
    ADD COLUMN unknown             boolean GENERATED ALWAYS AS (state = 'unknown') STORED,
    ADD COLUMN key_held            boolean GENERATED ALWAYS AS (key_state IS NOT NULL) STORED;

UPDATE operations o
SET key_state = k.state, response_status = k.response_status, response_headers = k.response_headers,
    response_body = k.response_body, completed_at = k.completed_at, response_expires_at = k.response_expires_at,
    key_expires_at = k.key_expires_at
FROM idempotency_keys k
WHERE k.account_id = o.account_id AND k.operation_id = o.id AND k.idempotency_key = o.idempotency_key;

DROP TABLE idempotency_keys;
CREATE UNIQUE INDEX operations_key ON operations (account_id, idempotency_key) WHERE key_held;
CREATE INDEX operations_created ON operations USING brin (created_at);
DROP INDEX operations_account_listing;
CREATE INDEX operations_account_listing ON operations (account_id, unknown, created_at, id);
DROP INDEX operations_unknown;
CREATE INDEX operations_unknown ON operations (created_at) WHERE unknown;
-- The recovery worker's scan: leased operations only, so a local write's claim (no lease) adds no entry.
DROP INDEX operations_expired_leases;
CREATE INDEX operations_expired_leases ON operations (lease_expires_at) WHERE lease_expires_at IS NOT NULL;

-- +goose Down
CREATE TABLE idempotency_keys (
    account_id          text        NOT NULL,
    idempotency_key     text        NOT NULL,
    fingerprint         text        NOT NULL,
    operation_id        text        NOT NULL,
    state               text        NOT NULL CHECK (state IN ('running', 'completed', 'expired')),
    response_status     integer,
    response_headers    jsonb,
    response_body       bytea,
    created_at          timestamptz NOT NULL DEFAULT now(),
    completed_at        timestamptz,
    response_expires_at timestamptz,
    key_expires_at      timestamptz,
    PRIMARY KEY (account_id, idempotency_key),
    FOREIGN KEY (account_id, operation_id) REFERENCES operations (account_id, id) DEFERRABLE INITIALLY DEFERRED
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, operation_id, state, response_status,
                              response_headers, response_body, created_at, completed_at, response_expires_at, key_expires_at)
SELECT account_id, idempotency_key, fingerprint, id, key_state, response_status, response_headers, response_body,
       created_at, completed_at, response_expires_at, key_expires_at
FROM operations WHERE key_state IS NOT NULL;
DROP INDEX operations_expired_leases;
CREATE INDEX operations_expired_leases ON operations (lease_expires_at) WHERE state IN ('queued', 'running');
DROP INDEX operations_unknown;
CREATE INDEX operations_unknown ON operations (updated_at) WHERE state = 'unknown';
DROP INDEX operations_account_listing;
CREATE INDEX operations_account_listing ON operations (account_id, (state = 'unknown'), created_at, id);
DROP INDEX operations_created;
DROP INDEX operations_key;
ALTER TABLE operations DROP COLUMN unknown, DROP COLUMN key_held;
ALTER TABLE operations DROP COLUMN key_state, DROP COLUMN response_status, DROP COLUMN response_headers,
    DROP COLUMN response_body, DROP COLUMN completed_at, DROP COLUMN response_expires_at, DROP COLUMN key_expires_at;
