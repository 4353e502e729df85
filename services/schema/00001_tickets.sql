-- +goose Up
-- The tickets service's tables (services/tickets). Keyed by account_id first, as every tenant table
-- (README "Sharding by account").
CREATE TABLE tickets (
    id              text        NOT NULL,
    account_id      text        NOT NULL,
    project         text        NOT NULL,
    title           text        NOT NULL,
    description     text        NOT NULL DEFAULT '',
    priority        text        NOT NULL CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
    status          text        NOT NULL CHECK (status IN ('open', 'resolved', 'closed')),
    source_event_id text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tickets_pkey PRIMARY KEY (account_id, id)
);
-- Business uniqueness: one ticket per source event and account, whatever idempotency key the caller used.
CREATE UNIQUE INDEX tickets_source_event ON tickets (account_id, source_event_id) WHERE source_event_id IS NOT NULL;
CREATE INDEX tickets_account_created ON tickets (account_id, created_at DESC);

CREATE TABLE ticket_comments (
    id         text        NOT NULL,
    ticket_id  text        NOT NULL,
    account_id text        NOT NULL,
    body       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ticket_comments_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT ticket_comments_ticket_id_fkey FOREIGN KEY (account_id, ticket_id) REFERENCES tickets (account_id, id)
);
CREATE INDEX ticket_comments_ticket ON ticket_comments (account_id, ticket_id, created_at);

-- Status changes actually made; a repeated PUT of the same status adds nothing here.
CREATE TABLE ticket_status_changes (
    id          bigserial   NOT NULL,
    ticket_id   text        NOT NULL,
    account_id  text        NOT NULL,
    from_status text        NOT NULL,
    to_status   text        NOT NULL,
    actor       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ticket_status_changes_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT ticket_status_changes_ticket_id_fkey FOREIGN KEY (account_id, ticket_id) REFERENCES tickets (account_id, id)
);
CREATE INDEX ticket_status_changes_ticket ON ticket_status_changes (account_id, ticket_id, id);

-- +goose Down
DROP TABLE ticket_status_changes;
DROP TABLE ticket_comments;
DROP TABLE tickets;
