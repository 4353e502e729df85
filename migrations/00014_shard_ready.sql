-- +goose Up
-- Shard-ready keys (README "Sharding by account"). Every table of one account's data is keyed by account_id first:
-- its primary key, its unique constraints and its foreign keys, so that a distributed PostgreSQL (Citus) can
-- place all of an account's rows on one node, distributed by account_id, and check every constraint there.
-- Ids stay globally unique (they are made by pkg/ids); the keys only add the account in front. Every query
-- names the account, so the lookups by id use the new keys. migrations/shard_test.go reads the catalog and fails
-- on any key that does not lead with account_id.

-- Foreign keys first: they depend on the unique indexes being replaced.
ALTER TABLE operation_events DROP CONSTRAINT operation_events_operation_id_fkey;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_operation_id_fkey;

-- Primary keys: (account_id, id). The old single-column indexes go with them, nothing is added beside.
ALTER TABLE operations DROP CONSTRAINT operations_pkey, ADD CONSTRAINT operations_pkey PRIMARY KEY (account_id, id);
ALTER TABLE operation_events DROP CONSTRAINT operation_events_pkey,
    ADD CONSTRAINT operation_events_pkey PRIMARY KEY (account_id, id);
ALTER TABLE approvals DROP CONSTRAINT approvals_pkey, ADD CONSTRAINT approvals_pkey PRIMARY KEY (account_id, id);
ALTER TABLE approval_events DROP CONSTRAINT approval_events_pkey,
    ADD CONSTRAINT approval_events_pkey PRIMARY KEY (account_id, id);

-- Foreign keys again, through the account.
ALTER TABLE operation_events ADD CONSTRAINT operation_events_operation_id_fkey
    FOREIGN KEY (account_id, operation_id) REFERENCES operations (account_id, id);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_operation_id_fkey
    FOREIGN KEY (account_id, operation_id) REFERENCES operations (account_id, id) DEFERRABLE INITIALLY DEFERRED;

-- The indexes that find a subject's rows, with the account in front as every query now names it (replaced,
-- not added).
DROP INDEX operation_events_operation;
CREATE INDEX operation_events_operation ON operation_events (account_id, operation_id, id);
DROP INDEX approval_events_approval;
CREATE INDEX approval_events_approval ON approval_events (account_id, approval_id, id);

-- A chain's head lives with its subject (an operation or an approval), on the account's node: the triggers
-- that link a record update the head in the same statement. Chain names stay the subject ids, so checkpoints
-- and the hashed records do not change.
ALTER TABLE audit_chain_heads ADD COLUMN account_id text;
UPDATE audit_chain_heads h SET account_id = o.account_id FROM operations o WHERE o.id = h.chain;
UPDATE audit_chain_heads h SET account_id = a.account_id FROM approvals a WHERE a.id = h.chain AND h.account_id IS NULL;
UPDATE audit_chain_heads h SET account_id = e.account_id FROM operation_events e
WHERE e.operation_id = h.chain AND h.account_id IS NULL;
UPDATE audit_chain_heads h SET account_id = e.account_id FROM approval_events e
WHERE e.approval_id = h.chain AND h.account_id IS NULL;
ALTER TABLE audit_chain_heads ALTER COLUMN account_id SET NOT NULL, DROP CONSTRAINT audit_chain_heads_pkey,
    ADD CONSTRAINT audit_chain_heads_pkey PRIMARY KEY (account_id, chain);

-- audit_append of 00006, with the chain's account.
-- +goose StatementBegin
CREATE FUNCTION audit_append(p_account text, p_chain text, p_head text, p_tail text, p_attempt boolean, p_none text,
                             OUT seq bigint, OUT prev_hash text, OUT hash text, OUT attempt bigint)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE audit_chain_heads h
    SET seq = h.seq + 1, prev_hash = h.hash, attempts = h.attempts + p_attempt::int, checkpointed = false,
        hash = audit_link(h.chain, h.seq + 1, h.hash,
                          p_head || CASE WHEN p_attempt THEN (h.attempts + 1)::text ELSE p_none END || p_tail)
    WHERE h.account_id = p_account AND h.chain = p_chain
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
    INSERT INTO audit_chain_heads (account_id, chain, seq, hash, prev_hash, attempts)
    VALUES (p_account, p_chain, 1, hash, prev_hash, coalesce(attempt, 0));
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION operation_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    link record;
BEGIN
    -- operation_event_parts, written out: plpgsql keeps these expressions' plans for the session, where a call
    -- of the SQL function would be planned again in every transaction.
    link := audit_append(NEW.account_id, NEW.operation_id,
        '{"account_id":' || to_json(NEW.account_id)::text || ',"actor":' || to_json(NEW.actor)::text || ',"attempt":',
        ',"created_at":"' || to_char(NEW.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '","detail":'
        || audit_canonical(NEW.detail) || ',"from_state":' || coalesce(to_json(NEW.from_state)::text, 'null')
        || ',"operation_id":' || to_json(NEW.operation_id)::text
        || ',"to_state":' || coalesce(to_json(NEW.to_state)::text, 'null') || ',"type":' || to_json(NEW.type)::text || '}',
        NEW.detail ? 'outcome' AND NEW.detail ? 'attempt_id', 'null');
    -- The id is taken now, under the chain head's lock, not by the column default before it: a writer that
    -- waited for the head (another replica's group of records) would otherwise hold an id older than the
    -- record it comes after, and the record order by id, which verify checks, would not be the chain's.
    NEW.id := nextval('operation_events_id_seq');
    NEW.attempt := link.attempt;
    NEW.chain_seq := link.seq;
    NEW.prev_hash := link.prev_hash;
    NEW.hash := link.hash;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION approval_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    link record;
BEGIN
    link := audit_append(NEW.account_id, NEW.approval_id, approval_event_record(NEW), '', false, '');
    NEW.id := nextval('approval_events_id_seq'); -- under the head's lock, as operation_events_chain
    NEW.chain_seq := link.seq;
    NEW.prev_hash := link.prev_hash;
    NEW.hash := link.hash;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
DROP FUNCTION audit_append(text, text, text, boolean, text);

-- +goose Down
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION operation_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
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
    -- The id is taken now, under the chain head's lock, not by the column default before it: a writer that
    -- waited for the head (another replica's group of records) would otherwise hold an id older than the
    -- record it comes after, and the record order by id, which verify checks, would not be the chain's.
    NEW.id := nextval('operation_events_id_seq');
    NEW.attempt := link.attempt;
    NEW.chain_seq := link.seq;
    NEW.prev_hash := link.prev_hash;
    NEW.hash := link.hash;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION approval_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    link record;
BEGIN
    link := audit_append(NEW.approval_id, approval_event_record(NEW), '', false, '');
    NEW.id := nextval('approval_events_id_seq'); -- under the head's lock, as operation_events_chain
    NEW.chain_seq := link.seq;
    NEW.prev_hash := link.prev_hash;
    NEW.hash := link.hash;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
DROP FUNCTION audit_append(text, text, text, text, boolean, text);
ALTER TABLE audit_chain_heads DROP CONSTRAINT audit_chain_heads_pkey, ADD CONSTRAINT audit_chain_heads_pkey PRIMARY KEY (chain);
ALTER TABLE audit_chain_heads DROP COLUMN account_id;

DROP INDEX approval_events_approval;
CREATE INDEX approval_events_approval ON approval_events (approval_id, id);
DROP INDEX operation_events_operation;
CREATE INDEX operation_events_operation ON operation_events (operation_id, id);

ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_operation_id_fkey;
ALTER TABLE operation_events DROP CONSTRAINT operation_events_operation_id_fkey;

ALTER TABLE approval_events DROP CONSTRAINT approval_events_pkey, ADD CONSTRAINT approval_events_pkey PRIMARY KEY (id);
ALTER TABLE approvals DROP CONSTRAINT approvals_pkey, ADD CONSTRAINT approvals_pkey PRIMARY KEY (id);
ALTER TABLE operation_events DROP CONSTRAINT operation_events_pkey, ADD CONSTRAINT operation_events_pkey PRIMARY KEY (id);
ALTER TABLE operations DROP CONSTRAINT operations_pkey, ADD CONSTRAINT operations_pkey PRIMARY KEY (id);

ALTER TABLE operation_events ADD CONSTRAINT operation_events_operation_id_fkey
    FOREIGN KEY (operation_id) REFERENCES operations (id);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_operation_id_fkey
    FOREIGN KEY (operation_id) REFERENCES operations (id) DEFERRABLE INITIALLY DEFERRED;
