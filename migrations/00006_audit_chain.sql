-- +goose Up
-- The tamper-evident audit chain (format: pkg/auditchain). Every operation event and every approval decision is
-- a record of a chain, one chain per operation and one per approval, linked by SHA-256 over RFC 8785 canonical
-- JSON. The links are computed here, by triggers, in the statement that inserts the record: every insert path is
-- chained, and no write needs another round trip. Writers of one chain queue on its row in audit_chain_heads;
-- writers of different chains never wait on each other.

-- audit_canonical renders a jsonb value as RFC 8785 canonical JSON. jsonb's own text for strings, true, false
-- and null is already canonical (only ", \ and control characters escaped, \u00xx in lower case); objects are
-- sorted by key, in code point order (RFC 8785 sorts by UTF-16 code units: the two differ only between
-- characters above U+FFFF and U+E000..U+FFFF, which no record key uses). Numbers are exact for integers of up
-- to 2^53, which is what records carry; other numbers go through float8 and may differ from RFC 8785's form
-- (verification then reports the record as changed: a false alarm, never a missed edit).
-- +goose StatementBegin
CREATE FUNCTION audit_canonical(v jsonb) RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    out text;
BEGIN
    CASE jsonb_typeof(v)
    WHEN 'object' THEN
        SELECT '{' || coalesce(string_agg(to_json(e.key)::text || ':' || audit_canonical(e.value), ',' ORDER BY e.key COLLATE "C"), '') || '}'
        INTO out FROM jsonb_each(v) AS e;
        RETURN out;
    WHEN 'array' THEN
        SELECT '[' || coalesce(string_agg(audit_canonical(e.value), ',' ORDER BY e.ord), '') || ']'
        INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, ord);
        RETURN out;
    WHEN 'number' THEN
        out := v::text;
        IF out ~ '^-?[0-9]{1,16}$' THEN
            RETURN out::numeric::text;
        END IF;
        RETURN (out::float8)::text;
    ELSE
        RETURN v::text;
    END CASE;
END
$$;
-- +goose StatementEnd

-- audit_append_only refuses changes to a table of records.
-- +goose StatementBegin
CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END
$$;
-- +goose StatementEnd

-- audit_time is how times appear inside hashed records (auditchain.TimeFormat).
-- +goose StatementBegin
CREATE FUNCTION audit_time(t timestamptz) RETURNS text LANGUAGE sql STABLE STRICT AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;
-- +goose StatementEnd

-- audit_link is auditchain.LinkHash: record is already canonical.
-- +goose StatementBegin
CREATE FUNCTION audit_link(chain text, seq bigint, prev text, record text) RETURNS text LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(convert_to('{"chain":' || to_json(chain)::text || ',"prev":"' || prev || '","record":' || record
                                    || ',"seq":' || seq || '}', 'UTF8')), 'hex')
$$;
-- +goose StatementEnd

-- The head of every chain: its last seq and hash. checkpointed is false while the chain moved since the last
-- checkpoint sealed it.
CREATE TABLE audit_chain_heads (
    chain        text PRIMARY KEY,
    seq          bigint      NOT NULL,
    hash         text        NOT NULL,
    prev_hash    text        NOT NULL,
    checkpointed boolean     NOT NULL DEFAULT false,
    -- How many attempt records the chain holds: numbers them under the same lock as the links.
    attempts     bigint      NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_chain_heads_moved ON audit_chain_heads (chain) WHERE NOT checkpointed;

-- audit_append links record (canonical JSON) as the next record of chain and returns its seq, prev and hash.
-- The upsert takes the chain's head row lock until the transaction ends: the chain's writers go one by one.
-- +goose StatementBegin
CREATE FUNCTION audit_append(p_chain text, p_record text, OUT seq bigint, OUT prev_hash text, OUT hash text)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit_chain_heads AS h (chain, seq, hash, prev_hash)
    VALUES (p_chain, 1, audit_link(p_chain, 1, repeat('0', 64), p_record), repeat('0', 64))
    ON CONFLICT (chain) DO UPDATE
        SET seq = h.seq + 1, prev_hash = h.hash, hash = audit_link(h.chain, h.seq + 1, h.hash, p_record),
            checkpointed = false, updated_at = now()
    RETURNING h.seq, h.prev_hash, h.hash INTO seq, prev_hash, hash;
END
$$;
-- +goose StatementEnd

ALTER TABLE operation_events ADD COLUMN chain_seq bigint, ADD COLUMN prev_hash text, ADD COLUMN hash text;

-- operation_event_record is the hashed content of an operation event (audit.EventRecord in Go builds the same).
-- +goose StatementBegin
CREATE FUNCTION operation_event_record(e operation_events) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT audit_canonical(jsonb_build_object(
        'account_id', e.account_id, 'actor', e.actor, 'created_at', audit_time(e.created_at), 'detail', e.detail,
        'from_state', e.from_state, 'operation_id', e.operation_id, 'to_state', e.to_state, 'type', e.type))
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION operation_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    link record;
    n    bigint;
BEGIN
    -- An attempt record (one HTTP attempt at a write: its detail has an outcome) gets the next attempt number
    -- of its operation. Taking it locks the chain's head, so number and link come from one writer's turn.
    IF NEW.detail ? 'outcome' AND NEW.detail ? 'attempt_id' THEN
        INSERT INTO audit_chain_heads AS h (chain, seq, hash, prev_hash, attempts)
        VALUES (NEW.operation_id, 0, repeat('0', 64), repeat('0', 64), 1)
        ON CONFLICT (chain) DO UPDATE SET attempts = h.attempts + 1
        RETURNING h.attempts INTO n;
        NEW.detail := NEW.detail || jsonb_build_object('attempt', n);
    END IF;
    link := audit_append(NEW.operation_id, operation_event_record(NEW));
    NEW.chain_seq := link.seq;
    NEW.prev_hash := link.prev_hash;
    NEW.hash := link.hash;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- Chain the events written before this migration, in their order.
ALTER TABLE operation_events DISABLE TRIGGER operation_events_append_only;
-- +goose StatementBegin
DO $$
DECLARE
    e operation_events;
    link record;
BEGIN
    FOR e IN SELECT * FROM operation_events ORDER BY operation_id, id LOOP
        link := audit_append(e.operation_id, operation_event_record(e));
        UPDATE operation_events SET chain_seq = link.seq, prev_hash = link.prev_hash, hash = link.hash WHERE id = e.id;
    END LOOP;
END
$$;
-- +goose StatementEnd
ALTER TABLE operation_events ENABLE TRIGGER operation_events_append_only;
ALTER TABLE operation_events ALTER COLUMN chain_seq SET NOT NULL, ALTER COLUMN prev_hash SET NOT NULL,
    ALTER COLUMN hash SET NOT NULL;
CREATE TRIGGER operation_events_chain BEFORE INSERT ON operation_events
    FOR EACH ROW EXECUTE FUNCTION operation_events_chain();

-- Approval decisions: requested, approved, denied, used. The approvals row is the current state; these are its
-- history, written by a trigger on approvals so no path that changes an approval can skip them.
CREATE TABLE approval_events (
    id          bigserial PRIMARY KEY,
    approval_id text        NOT NULL,
    account_id  text        NOT NULL,
    type        text        NOT NULL,
    actor       text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    chain_seq   bigint      NOT NULL,
    prev_hash   text        NOT NULL,
    hash        text        NOT NULL
);
CREATE INDEX approval_events_approval ON approval_events (approval_id, id);
CREATE TRIGGER approval_events_append_only BEFORE UPDATE OR DELETE ON approval_events
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();

-- +goose StatementBegin
CREATE FUNCTION approval_event_record(e approval_events) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT audit_canonical(jsonb_build_object(
        'account_id', e.account_id, 'actor', e.actor, 'approval_id', e.approval_id,
        'created_at', audit_time(e.created_at), 'detail', e.detail, 'type', e.type))
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION approval_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    link record;
BEGIN
    link := audit_append(NEW.approval_id, approval_event_record(NEW));
    NEW.chain_seq := link.seq;
    NEW.prev_hash := link.prev_hash;
    NEW.hash := link.hash;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER approval_events_chain BEFORE INSERT ON approval_events
    FOR EACH ROW EXECUTE FUNCTION approval_events_chain();

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
    IF NEW.state IS DISTINCT FROM OLD.state THEN
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

-- Checkpoints: one chain of them, whatever the number of replicas writing (package audit serializes writers).
CREATE TABLE audit_checkpoints (
    seq        bigint PRIMARY KEY,
    prev_hash  text        NOT NULL,
    created_at timestamptz NOT NULL,
    heads      jsonb       NOT NULL,
    hash       text        NOT NULL,
    signature  text
);
CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();

-- +goose Down
DROP TABLE audit_checkpoints;
DROP TRIGGER approvals_audit ON approvals;
DROP FUNCTION approvals_audit();
DROP TABLE approval_events;
DROP FUNCTION approval_events_chain();
DROP FUNCTION approval_event_record(approval_events);
DROP TRIGGER operation_events_chain ON operation_events;
DROP FUNCTION operation_events_chain();
DROP FUNCTION operation_event_record(operation_events);
ALTER TABLE operation_events DROP COLUMN chain_seq, DROP COLUMN prev_hash, DROP COLUMN hash;
DROP FUNCTION audit_append(text, text);
DROP TABLE audit_chain_heads;
DROP FUNCTION audit_link(text, bigint, text, text);
DROP FUNCTION audit_time(timestamptz);
DROP FUNCTION audit_canonical(jsonb);
DROP FUNCTION audit_append_only();
