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
CREATE FUNCTION audit_number(v jsonb) RETURNS text LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN v::text ~ '^-?[0-9]{1,15}$' THEN v::text
                WHEN v::text ~ '^-?[0-9]{16}$' AND abs(v::text::numeric) <= 9007199254740992 THEN v::text
                ELSE (v::text::float8)::text END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION audit_canonical(v jsonb) RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    out text;
BEGIN
    CASE jsonb_typeof(v)
    WHEN 'object' THEN
        -- Scalars inline; only nested objects and arrays recurse.
        SELECT '{' || coalesce(string_agg(to_json(e.key)::text || ':' || CASE jsonb_typeof(e.value)
                   WHEN 'object' THEN audit_canonical(e.value) WHEN 'array' THEN audit_canonical(e.value)
                   -- audit_number written out: a call of it would not be inlined (it is STRICT, its CASE is not).
                   WHEN 'number' THEN CASE WHEN e.value::text ~ '^-?[0-9]{1,15}$' THEN e.value::text
                                           WHEN e.value::text ~ '^-?[0-9]{16}$' AND abs(e.value::text::numeric) <= 9007199254740992 THEN e.value::text
                                           ELSE (e.value::text::float8)::text END
                   ELSE e.value::text END,
               ',' ORDER BY e.key COLLATE "C"), '') || '}'
        INTO out FROM jsonb_each(v) AS e;
        RETURN out;
    WHEN 'array' THEN
        SELECT '[' || coalesce(string_agg(audit_canonical(e.value), ',' ORDER BY e.ord), '') || ']'
        INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, ord);
        RETURN out;
    WHEN 'number' THEN
        RETURN audit_number(v);
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
-- checkpoint sealed it. attempts counts the chain's attempt records, to number them under the same lock.
CREATE TABLE audit_chain_heads (
    chain        text PRIMARY KEY,
    seq          bigint  NOT NULL,
    hash         text    NOT NULL,
    prev_hash    text    NOT NULL,
    checkpointed boolean NOT NULL DEFAULT false,
    attempts     bigint  NOT NULL DEFAULT 0
);
CREATE INDEX audit_chain_heads_moved ON audit_chain_heads (chain) WHERE NOT checkpointed;

-- audit_append links the next record of a chain and returns its seq, prev and hash. The record is
-- p_head || N || p_tail, where N is the record's attempt number within the chain when p_attempt, else p_none:
-- so numbering and linking happen in one statement, under the head row's lock, which the chain's writers take
-- one after another until their transactions end.
-- +goose StatementBegin
CREATE FUNCTION audit_append(p_chain text, p_head text, p_tail text, p_attempt boolean, p_none text,
                             OUT seq bigint, OUT prev_hash text, OUT hash text, OUT attempt bigint)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE audit_chain_heads h
    SET seq = h.seq + 1, prev_hash = h.hash, attempts = h.attempts + p_attempt::int, checkpointed = false,
        hash = audit_link(h.chain, h.seq + 1, h.hash,
                          p_head || CASE WHEN p_attempt THEN (h.attempts + 1)::text ELSE p_none END || p_tail)
    WHERE h.chain = p_chain
    RETURNING h.seq, h.prev_hash, h.hash, CASE WHEN p_attempt THEN h.attempts END INTO seq, prev_hash, hash, attempt;
    IF FOUND THEN
        RETURN;
    END IF;
    -- A new chain: its first record is written in the transaction that creates its subject, which no one else
    -- sees yet, so no concurrent first record can race this insert.
    seq := 1;
    prev_hash := repeat('0', 64);
    attempt := CASE WHEN p_attempt THEN 1 END;
    hash := audit_link(p_chain, 1, prev_hash, p_head || coalesce(attempt::text, p_none) || p_tail);
    INSERT INTO audit_chain_heads (chain, seq, hash, prev_hash, attempts)
    VALUES (p_chain, 1, hash, prev_hash, coalesce(attempt, 0));
END
$$;
-- +goose StatementEnd

-- attempt numbers the attempt records of an operation (one HTTP attempt at a write: its detail has an
-- attempt_id and an outcome); the other events have none.
ALTER TABLE operation_events ADD COLUMN attempt bigint, ADD COLUMN chain_seq bigint, ADD COLUMN prev_hash text,
    ADD COLUMN hash text;

-- operation_event_parts splits the canonical JSON of an operation event around its attempt number: the hashed
-- record is head || attempt-or-null || tail (audit.Verify builds the same object in Go).
-- +goose StatementBegin
CREATE FUNCTION operation_event_parts(e operation_events, OUT head text, OUT tail text, OUT is_attempt boolean)
LANGUAGE sql STABLE AS $$
    SELECT '{"account_id":' || to_json(e.account_id)::text || ',"actor":' || to_json(e.actor)::text || ',"attempt":',
           ',"created_at":"' || audit_time(e.created_at) || '","detail":' || audit_canonical(e.detail)
           || ',"from_state":' || coalesce(to_json(e.from_state)::text, 'null')
           || ',"operation_id":' || to_json(e.operation_id)::text
           || ',"to_state":' || coalesce(to_json(e.to_state)::text, 'null') || ',"type":' || to_json(e.type)::text || '}',
           e.detail ? 'outcome' AND e.detail ? 'attempt_id'
$$;
-- +goose StatementEnd

-- operation_event_record is the hashed record of a stored event, for tools and tests.
-- +goose StatementBegin
CREATE FUNCTION operation_event_record(e operation_events) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT p.head || coalesce(e.attempt::text, 'null') || p.tail FROM operation_event_parts(e) AS p
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION operation_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    link record;
BEGIN
    -- operation_event_parts, written out: plpgsql keeps these expressions' plans for the session, where a call
    -- of the SQL function would be planned again in every transaction.
    link := audit_append(NEW.operation_id,
        '{"account_id":' || to_json(NEW.account_id)::text || ',"actor":' || to_json(NEW.actor)::text || ',"attempt":',
        ',"created_at":"' || to_char(NEW.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '","detail":'
        || audit_canonical(NEW.detail) || ',"from_state":' || coalesce(to_json(NEW.from_state)::text, 'null')
        || ',"operation_id":' || to_json(NEW.operation_id)::text
        || ',"to_state":' || coalesce(to_json(NEW.to_state)::text, 'null') || ',"type":' || to_json(NEW.type)::text || '}',
        NEW.detail ? 'outcome' AND NEW.detail ? 'attempt_id', 'null');
    NEW.attempt := link.attempt;
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
    p record;
    link record;
BEGIN
    FOR e IN SELECT * FROM operation_events ORDER BY operation_id, id LOOP
        p := operation_event_parts(e);
        link := audit_append(e.operation_id, p.head, p.tail, p.is_attempt, 'null');
        UPDATE operation_events SET attempt = link.attempt, chain_seq = link.seq, prev_hash = link.prev_hash,
            hash = link.hash WHERE id = e.id;
    END LOOP;
END
$$;
-- +goose StatementEnd
ALTER TABLE operation_events ENABLE TRIGGER operation_events_append_only;
ALTER TABLE operation_events ALTER COLUMN chain_seq SET NOT NULL, ALTER COLUMN prev_hash SET NOT NULL,
    ALTER COLUMN hash SET NOT NULL;
CREATE TRIGGER operation_events_chain BEFORE INSERT ON operation_events
    FOR EACH ROW EXECUTE FUNCTION operation_events_chain();

-- An operation whose effect the other side executed more than once ends in duplicate_effect_confirmed: neither
-- succeeded nor failed, and nothing retries it (a person corrects it, as a new operation).
ALTER TABLE operations DROP CONSTRAINT operations_state_check;
ALTER TABLE operations ADD CONSTRAINT operations_state_check
    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'unknown', 'duplicate_effect_confirmed'));

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
    link := audit_append(NEW.approval_id, approval_event_record(NEW), '', false, '');
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
-- Finds the checkpoints that sealed one chain (a timeline, verify --operation) without reading them all.
CREATE INDEX audit_checkpoints_heads ON audit_checkpoints USING gin (heads jsonb_path_ops);
CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();

-- +goose Down
ALTER TABLE operations DROP CONSTRAINT operations_state_check;
ALTER TABLE operations ADD CONSTRAINT operations_state_check
    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'unknown'));
DROP TABLE audit_checkpoints;
DROP TRIGGER approvals_audit ON approvals;
DROP FUNCTION approvals_audit();
DROP TABLE approval_events;
DROP FUNCTION approval_events_chain();
DROP FUNCTION approval_event_record(approval_events);
DROP TRIGGER operation_events_chain ON operation_events;
DROP FUNCTION operation_events_chain();
DROP FUNCTION operation_event_record(operation_events);
DROP FUNCTION operation_event_parts(operation_events);
ALTER TABLE operation_events DROP COLUMN attempt, DROP COLUMN chain_seq, DROP COLUMN prev_hash, DROP COLUMN hash;
DROP FUNCTION audit_append(text, text, text, boolean, text);
DROP TABLE audit_chain_heads;
DROP FUNCTION audit_link(text, bigint, text, text);
DROP FUNCTION audit_time(timestamptz);
DROP FUNCTION audit_canonical(jsonb);
DROP FUNCTION audit_number(jsonb);
DROP FUNCTION audit_append_only();
