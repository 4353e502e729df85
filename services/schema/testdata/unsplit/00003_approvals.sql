-- +goose Up
-- Approvals bind one account, one idempotency key and one request fingerprint; a person with an approver key
-- other than the requester grants or denies them before they expire.
CREATE TABLE approvals (
    id                   text PRIMARY KEY,
    account_id           text        NOT NULL,
    method               text        NOT NULL,
    path                 text        NOT NULL,
    route                text        NOT NULL,
    idempotency_key      text        NOT NULL,
    fingerprint          text        NOT NULL,
    summary              jsonb       NOT NULL,
    state                text        NOT NULL CHECK (state IN ('pending', 'approved', 'denied')),
    requested_by         text        NOT NULL,
    decided_by           text,
    decided_at           timestamptz,
    expires_at           timestamptz NOT NULL,
    used_by_operation_id text,
    created_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX approvals_account_key ON approvals (account_id, idempotency_key);

-- +goose Down
DROP TABLE approvals;
