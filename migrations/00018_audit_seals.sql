-- +goose Up
-- Audit records are sealed off the request path (package audit, "Sealing"): a request inserts its records as
-- plain immutable rows, and a sequencer seals them in batches a moment later. Nothing in the request locks a
-- chain head or computes a hash, so the chaining triggers, the head table and its checkpoints go, with the SQL
-- canonicalization that only they used, and the link columns of the records.
--
-- Records written before this migration lose their links and are sealed as they stand by the sequencer's first
-- runs, in id order: check them with the previous release's `retrysafe audit verify` before migrating.
DROP TRIGGER operation_events_chain ON operation_events;
DROP TRIGGER approval_events_chain ON approval_events;
DROP FUNCTION operation_events_chain();
DROP FUNCTION approval_events_chain();
DROP FUNCTION audit_append(text, text, text, text, boolean, text);
DROP FUNCTION operation_event_record(operation_events);
DROP FUNCTION operation_event_parts(operation_events);
DROP FUNCTION approval_event_record(approval_events);
DROP FUNCTION audit_link(text, bigint, text, text);
DROP FUNCTION audit_canonical(jsonb);
DROP FUNCTION audit_number(jsonb);
DROP FUNCTION audit_name_order(text);
DROP FUNCTION audit_float8_text(float8);
DROP FUNCTION audit_float8(numeric);
DROP TABLE audit_chain_heads;
DROP TABLE audit_checkpoints;

-- xid is the writing transaction's id: the sequencer seals a record only once every transaction with an id
-- below it has ended, so one that commits late is never skipped. The rows already there take 0, the lowest.
ALTER TABLE operation_events DROP COLUMN attempt, DROP COLUMN chain_seq, DROP COLUMN prev_hash, DROP COLUMN hash,
    ADD COLUMN xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE operation_events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
CREATE INDEX operation_events_unsealed ON operation_events (xid, id);
ALTER TABLE approval_events DROP COLUMN chain_seq, DROP COLUMN prev_hash, DROP COLUMN hash,
    ADD COLUMN xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE approval_events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
CREATE INDEX approval_events_unsealed ON approval_events (xid, id);

-- is_attempt_record says whether an operation event with this detail is an attempt record: one HTTP attempt at
-- a write, whose detail has an attempt_id and an outcome.
CREATE FUNCTION is_attempt_record(detail jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT detail ? 'outcome' AND detail ? 'attempt_id'
$$;

-- An operation's events as its history shows them: seq is the event's place in the operation's history (id
-- order) and attempt numbers its attempt records in the same order. Both are read, not stored, so a retry's
-- record is one plain insert. A filter on the operation is applied before the numbering.
CREATE VIEW operation_events_numbered AS
SELECT e.*, row_number() OVER w AS seq,
       CASE WHEN is_attempt_record(e.detail) THEN count(*) FILTER (WHERE is_attempt_record(e.detail)) OVER w END AS attempt
FROM operation_events e
WINDOW w AS (PARTITION BY e.account_id, e.operation_id ORDER BY e.id);

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

-- +goose Down
-- +goose StatementBegin
DO $$ BEGIN RAISE EXCEPTION 'migration 00018 (audit seals) cannot be undone: the chain links it dropped are gone'; END $$;
-- +goose StatementEnd
