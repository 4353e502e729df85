-- +goose Up
-- The console (pkg/console): sessions of people signed in with an API key, and what its pages need.

-- A session is an opaque random id (only its SHA-256 is stored, so a read of this table signs nobody in), the
-- key it was opened with (by key id, never the secret) and when it was last used; 12 hours idle ends it.
CREATE TABLE console_sessions (
    id_hash      text PRIMARY KEY,
    account_id   text        NOT NULL,
    role         text        NOT NULL,
    key_id       text        NOT NULL,
    csrf_token   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX console_sessions_idle ON console_sessions (last_seen_at);

-- The body the agent will send, RFC 8785 canonical, so an approver reads exactly what runs. Approvals made
-- before this migration have none.
ALTER TABLE approvals ADD COLUMN body text;
-- An approved approval not yet used can be revoked: the guard then refuses it like a denied one.
ALTER TABLE approvals DROP CONSTRAINT approvals_state_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_state_check CHECK (state IN ('pending', 'approved', 'denied', 'revoked'));
-- The inbox: an account's approvals in one state, newest first.
CREATE INDEX approvals_account_state ON approvals (account_id, state, created_at DESC, id DESC);

-- The operations list: an account's operations, unknown first, then newest first, one page at a time (keyset).
CREATE INDEX operations_account_listing ON operations (account_id, (state = 'unknown'), created_at, id);

-- +goose Down
DROP INDEX operations_account_listing;
DROP INDEX approvals_account_state;
UPDATE approvals SET state = 'denied' WHERE state = 'revoked';
ALTER TABLE approvals DROP CONSTRAINT approvals_state_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_state_check CHECK (state IN ('pending', 'approved', 'denied'));
ALTER TABLE approvals DROP COLUMN body;
DROP TABLE console_sessions;
