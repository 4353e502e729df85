-- +goose Up
-- The library's tables: operations, which hold their idempotency keys, and their events; approvals and their
-- events; grants and their events; the audit records' seals; console sessions.
--
-- Every table that holds one account's data is keyed by account_id first (docs/sharding.md): its primary key, its
-- unique constraints and indexes and its foreign keys, so that a distributed PostgreSQL (Citus) can place all of
-- an account's rows on one node and check every constraint there. Ids stay globally unique (pkg/ids); the keys
-- only add the account in front, and every query names the account. migrations/shard_test.go reads the catalog
-- and fails on any key that does not lead with account_id.

-- Operations: one row per intended action, with the state a caller that timed out can ask about. An operation
-- whose effect the other side executed more than once ends in duplicate_effect_confirmed: neither succeeded nor
-- failed, and nothing retries it (a person corrects it, as a new operation).
--
-- An idempotency key is a column of the operation it started: the claim inserts the operation, the completion
-- stores the response on it, in place. key_state is the key's: running (claimed, no response yet), completed
-- (the response is stored), expired (the response was pruned; the key still never runs again), or NULL: the
-- operation holds no key (it has none, its claim was released before its effect was sent, or its key outlived
-- its lifetime and was pruned). Of one account's operations with one key, at most one holds it (key_held): the
-- unique index operations_key. The others, which gave their key up, are in operations_released_key, so a create
-- adds one entry by its key, not two; an operation moves from the one to the other when its key is released or
-- pruned, a write that changes key_held anyway.
--
-- A key outlives its stored response. Pruning after the retention removes the response (key_state 'expired'),
-- not the key: with its fingerprint and operation it is kept until key_expires_at, so it never runs twice while
-- it lives. Both expiries are set when the key completes (its operation's outcome is known).
--
-- A completion changes no indexed column, so PostgreSQL writes it as a heap-only update (HOT: no index entry
-- added): no index reads state, key_state or updated_at. The two facts the indexes need from them are generated
-- columns, which keep their value when an operation moves from running to succeeded: unknown (listing and the
-- recovery worker's scan) and key_held. Pruning scans by age with a BRIN index on created_at.
CREATE TABLE operations (
    id                  text        NOT NULL,
    account_id          text        NOT NULL,
    kind                text        NOT NULL,
    state               text        NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled',
                                                              'unknown', 'duplicate_effect_confirmed')),
    idempotency_key     text,
    fingerprint         text,
    resource_type       text,
    resource_id         text,
    -- While an external effect is in flight the operation holds a lease; when it expires the recovery worker
    -- marks the operation unknown and hands it to the reconciler of its kind.
    lease_expires_at    timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    key_state           text CHECK (key_state IN ('running', 'completed', 'expired')),
    response_status     integer,
    response_headers    jsonb,
    response_body       bytea,
    completed_at        timestamptz,
    response_expires_at timestamptz,
    key_expires_at      timestamptz,
    unknown             boolean GENERATED ALWAYS AS (state = 'unknown') STORED,
    key_held            boolean GENERATED ALWAYS AS (key_state IS NOT NULL) STORED,
    PRIMARY KEY (account_id, id)
);
CREATE UNIQUE INDEX operations_key ON operations (account_id, idempotency_key) WHERE key_held;
CREATE INDEX operations_released_key ON operations (account_id, idempotency_key)
    WHERE NOT key_held AND idempotency_key IS NOT NULL;
CREATE INDEX operations_created ON operations USING brin (created_at);
-- The operations list: an account's operations, unknown first, then newest first, one page at a time (keyset).
CREATE INDEX operations_account_listing ON operations (account_id, unknown, created_at, id);
CREATE INDEX operations_unknown ON operations (created_at) WHERE unknown;
-- The recovery worker's scan: leased operations only, so a local write's claim (no lease) adds no entry.
CREATE INDEX operations_expired_leases ON operations (lease_expires_at) WHERE lease_expires_at IS NOT NULL;

-- The append-only history of every operation: claimed, completed, replayed, conflict_rejected, failed,
-- state_changed, reconciled, ... Every event is an audit record (pkg/audit, "Sealing"): a request inserts it as
-- a plain immutable row, and a sequencer seals records in batches a moment later (audit_seals).
--
-- Records are always read by their chain (an operation's events), in storage order, and never by id alone: the
-- primary key is that order, (account_id, operation_id, id).
--
-- A local write's operation is inserted at the end of its transaction, completed (package idem). A record the
-- write appends to its operation before then (an approval checked, a ticket found already there) names an
-- operation not inserted yet: the records' foreign key to their operation is checked at COMMIT.
--
-- xid is the writing transaction's id: the sequencer seals a record only once every transaction with an id below
-- it has ended, so one that commits late is never skipped.
CREATE TABLE operation_events (
    id           bigserial,
    operation_id text        NOT NULL,
    account_id   text        NOT NULL,
    type         text        NOT NULL,
    from_state   text,
    to_state     text,
    actor        text        NOT NULL,
    detail       jsonb       NOT NULL DEFAULT '{}',
    -- The attempt the event is about and, on an attempt record (one HTTP attempt at a write), the outcome it was
    -- answered with: the detail's attempt_id and outcome, as columns (package opstore writes both from the
    -- detail's type). An attempt record is an event with both.
    attempt_id   text,
    outcome      text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    xid          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (account_id, operation_id, id),
    CONSTRAINT operation_events_operation_id_fkey FOREIGN KEY (account_id, operation_id)
        REFERENCES operations (account_id, id) DEFERRABLE INITIALLY DEFERRED
);
CREATE INDEX operation_events_unsealed ON operation_events (xid, id);

-- +goose StatementBegin
CREATE FUNCTION operation_events_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'operation_events is append-only';
END
$$ LANGUAGE plpgsql;
-- +goose StatementEnd
CREATE TRIGGER operation_events_append_only BEFORE UPDATE OR DELETE ON operation_events
    FOR EACH ROW EXECUTE FUNCTION operation_events_append_only();

-- operation_settled refuses, as an error of its own (SQLSTATE RS001), a completion or release that found its
-- operation no longer running under its key (n = 0 rows moved): the statement fails, and with it the transaction
-- and whatever was sent after it, COMMIT included. It returns n otherwise.
-- +goose StatementBegin
CREATE FUNCTION operation_settled(n bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF n = 0 THEN
        RAISE EXCEPTION 'operation already settled' USING ERRCODE = 'RS001';
    END IF;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- operation_state is an operation's state, for the queries of other tables that show it (a deploy shows unknown
-- while its operation is), read by the operation's whole key.
CREATE FUNCTION operation_state(account_id text, operation_id text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT state FROM operations WHERE account_id = $1 AND id = $2
$$;

-- An operation's lineage is held here, not only checked before a write (package idem), so requests that race
-- past the check cannot both write; the loser meets the index after waiting for the winner's transaction, and
-- its write is rolled back:
--   operation_events_successor: at most one superseded event per operation, so one successor;
--   operation_events_attempt: an attempt id has at most one attempt record in an operation.
CREATE UNIQUE INDEX operation_events_successor ON operation_events (account_id, operation_id)
    WHERE type = 'superseded';
CREATE UNIQUE INDEX operation_events_attempt ON operation_events (account_id, operation_id, attempt_id)
    WHERE attempt_id IS NOT NULL AND outcome IS NOT NULL;

-- An operation's events as its history shows them: seq is the event's place in the operation's history (id
-- order) and attempt numbers its attempt records in the same order. Both are read, not stored, so a retry's
-- record is one plain insert. A filter on the operation is applied before the numbering.
CREATE VIEW operation_events_numbered AS
SELECT e.*, row_number() OVER w AS seq,
       CASE WHEN e.attempt_id IS NOT NULL AND e.outcome IS NOT NULL
            THEN count(*) FILTER (WHERE e.attempt_id IS NOT NULL AND e.outcome IS NOT NULL) OVER w END AS attempt
FROM operation_events e
WINDOW w AS (PARTITION BY e.account_id, e.operation_id ORDER BY e.id);

-- Approvals bind one account, one idempotency key and one request fingerprint; a person with an approver key
-- other than the requester grants or denies them before they expire. An approved approval not yet used can be
-- revoked: the guard then refuses it like a denied one.
--
-- Expiry is a recorded decision: an approval that runs out (pending, or approved and never used, past
-- expires_at) is moved to state expired, by the approval expiry worker or by a decision that finds it expired,
-- and approvals_audit writes its `expired` record. The UPDATE that moves it names the states it moves from, so
-- of two replicas that race, the second finds it expired already and records nothing: one record per approval.
CREATE TABLE approvals (
    id                   text        NOT NULL,
    account_id           text        NOT NULL,
    method               text        NOT NULL,
    path                 text        NOT NULL,
    route                text        NOT NULL,
    idempotency_key      text        NOT NULL,
    fingerprint          text        NOT NULL,
    summary              jsonb       NOT NULL,
    state                text        NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'revoked', 'expired')),
    requested_by         text        NOT NULL,
    decided_by           text,
    decided_at           timestamptz,
    expires_at           timestamptz NOT NULL,
    used_by_operation_id text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- The body the agent will send, RFC 8785 canonical, so an approver reads exactly what runs.
    body                 text,
    PRIMARY KEY (account_id, id)
);
CREATE INDEX approvals_account_key ON approvals (account_id, idempotency_key);
-- The inbox: an account's approvals in one state, newest first.
CREATE INDEX approvals_account_state ON approvals (account_id, state, created_at DESC, id DESC);
-- The expiry worker's search: the approvals that can still run out.
CREATE INDEX approvals_expiring ON approvals (expires_at) WHERE state IN ('pending', 'approved') AND used_by_operation_id IS NULL;

-- Approval decisions: requested, approved, denied, revoked, expired, used. The approvals row is the current
-- state; these are its history, audit records like operation_events, written by a trigger on approvals so no
-- path that changes an approval can skip them. Keyed by their chain, (account_id, approval_id, id).
CREATE TABLE approval_events (
    id          bigserial,
    approval_id text        NOT NULL,
    account_id  text        NOT NULL,
    type        text        NOT NULL,
    actor       text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    xid         xid8        NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (account_id, approval_id, id)
);
CREATE INDEX approval_events_unsealed ON approval_events (xid, id);

-- audit_append_only refuses changes to a table of records.
-- +goose StatementBegin
CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER approval_events_append_only BEFORE UPDATE OR DELETE ON approval_events
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();

-- audit_time is how times appear inside hashed records (auditchain.TimeFormat).
-- +goose StatementBegin
CREATE FUNCTION audit_time(t timestamptz) RETURNS text LANGUAGE sql STABLE STRICT AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION approvals_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'requested', NEW.requested_by, jsonb_build_object(
            'method', NEW.method, 'path', NEW.path, 'idempotency_key', NEW.idempotency_key,
            'fingerprint', NEW.fingerprint, 'summary', NEW.summary, 'expires_at', audit_time(NEW.expires_at)));
        RETURN NEW;
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state AND NEW.state = 'expired' THEN
        -- Nobody decided it: time did. decided_by keeps the last person's decision (an approval that expired
        -- approved names its approver).
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'expired', 'system:approval-expiry',
                jsonb_build_object('from_state', OLD.state, 'expires_at', audit_time(NEW.expires_at)));
    ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, NEW.state, coalesce(NEW.decided_by, 'unknown'),
                jsonb_build_object('from_state', OLD.state));
    END IF;
    IF NEW.used_by_operation_id IS DISTINCT FROM OLD.used_by_operation_id THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'used', 'system:approval', jsonb_build_object('operation_id', NEW.used_by_operation_id));
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER approvals_audit AFTER INSERT OR UPDATE ON approvals FOR EACH ROW EXECUTE FUNCTION approvals_audit();

-- Grants: an approver's authority for a group of calls of one agent key (and, when agent_run_id is set, of one
-- run of it): writes of the listed operation kinds that would need an approval, at most max_uses of them, until
-- expires_at or until revoked. A write that sends the grant's id (Grant-Id) uses one in its claim transaction
-- (uses, last_operation_id, last_attempt_id), so a write rolled back gives its use back. A grant never stands in
-- for the approval of a write that supersedes an operation whose outcome is unknown: that one needs its own.
-- The row is the current state; grant_events is its history, written by grants_audit.
CREATE TABLE grants (
    id                text        NOT NULL,
    account_id        text        NOT NULL,
    agent_key_id      text        NOT NULL,
    agent_run_id      text,
    kinds             jsonb       NOT NULL,
    max_uses          integer     NOT NULL CHECK (max_uses > 0),
    uses              integer     NOT NULL DEFAULT 0 CHECK (uses >= 0 AND uses <= max_uses),
    expires_at        timestamptz NOT NULL,
    granted_by        text        NOT NULL,
    granted_at        timestamptz NOT NULL DEFAULT now(),
    revoked_by        text,
    revoked_at        timestamptz,
    last_operation_id text,
    last_attempt_id   text,
    last_kind         text,
    PRIMARY KEY (account_id, id)
);
CREATE INDEX grants_account_granted ON grants (account_id, granted_at DESC, id DESC);

-- Grant records: granted, used (one per write that used it, naming its operation and attempt), revoked. Audit
-- records like approval_events, written by a trigger on grants so no path that changes a grant can skip them.
CREATE TABLE grant_events (
    id          bigserial,
    grant_id    text        NOT NULL,
    account_id  text        NOT NULL,
    type        text        NOT NULL,
    actor       text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    xid         xid8        NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (account_id, grant_id, id)
);
CREATE INDEX grant_events_unsealed ON grant_events (xid, id);
CREATE TRIGGER grant_events_append_only BEFORE UPDATE OR DELETE ON grant_events
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();

-- +goose StatementBegin
CREATE FUNCTION grants_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO grant_events (grant_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'granted', NEW.granted_by, jsonb_build_object(
            'agent_key_id', NEW.agent_key_id, 'agent_run_id', NEW.agent_run_id, 'kinds', NEW.kinds,
            'max_uses', NEW.max_uses, 'expires_at', audit_time(NEW.expires_at)));
        RETURN NEW;
    END IF;
    IF NEW.uses IS DISTINCT FROM OLD.uses THEN
        INSERT INTO grant_events (grant_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'used', 'system:grant', jsonb_build_object(
            'operation_id', NEW.last_operation_id, 'attempt_id', NEW.last_attempt_id, 'kind', NEW.last_kind, 'use', NEW.uses));
    END IF;
    IF NEW.revoked_at IS DISTINCT FROM OLD.revoked_at THEN
        INSERT INTO grant_events (grant_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'revoked', coalesce(NEW.revoked_by, 'unknown'), jsonb_build_object('uses', NEW.uses));
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER grants_audit AFTER INSERT OR UPDATE ON grants FOR EACH ROW EXECUTE FUNCTION grants_audit();

-- One seal per batch of records, a chain of them (auditchain.Seal): records holds the batch's entries (which
-- record, of which subject, with which hash), in sealed order; records_hash, their hash; through, where the
-- batch ends in each table's (xid, id) order. Written by one sequencer at a time, over every account.
CREATE TABLE audit_seals (
    seq          bigint PRIMARY KEY,
    prev_hash    text        NOT NULL,
    created_at   timestamptz NOT NULL,
    first_record bigint      NOT NULL,
    record_count bigint      NOT NULL,
    through      jsonb       NOT NULL,
    records      jsonb       NOT NULL,
    records_hash text        NOT NULL,
    hash         text        NOT NULL,
    signature    text
);
-- Finds the seals of one operation's or approval's records (a timeline, verify --operation) from what the seals
-- themselves hold, so removing an operation's records cannot hide it from that check.
CREATE INDEX audit_seals_subjects ON audit_seals USING gin (jsonb_path_query_array(records, '$[*].subject'));
CREATE TRIGGER audit_seals_append_only BEFORE UPDATE OR DELETE ON audit_seals
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();

-- The console (pkg/console): sessions of people signed in with an API key. A session is an opaque random id
-- (only its SHA-256 is stored, so a read of this table signs nobody in), the key it was opened with (by key id,
-- never the secret) and when it was last used; 12 hours idle ends it.
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

-- +goose Down
DROP TABLE console_sessions;
DROP TABLE audit_seals;
DROP TRIGGER grants_audit ON grants;
DROP FUNCTION grants_audit();
DROP TABLE grant_events;
DROP TABLE grants;
DROP TRIGGER approvals_audit ON approvals;
DROP FUNCTION approvals_audit();
DROP FUNCTION audit_time(timestamptz);
DROP TABLE approval_events;
DROP FUNCTION audit_append_only();
DROP TABLE approvals;
DROP VIEW operation_events_numbered;
DROP INDEX operation_events_attempt;
DROP INDEX operation_events_successor;
DROP FUNCTION operation_state(text, text);
DROP FUNCTION operation_settled(bigint);
DROP TABLE operation_events;
DROP FUNCTION operation_events_append_only();
DROP TABLE operations;
