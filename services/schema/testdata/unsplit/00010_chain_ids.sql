-- +goose Up
-- Records of one chain are stored in chain order (their ids grow with their seq), which audit verify checks. The
-- id came from the column default, taken before the trigger waits for the chain head: two writers of one chain
-- in different processes (replicas, each grouping its retries' records) could then store seq 7 with an id below
-- seq 6's, and verify reported a chain that was intact as out of order. The triggers now take the id once they
-- hold the head.
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

-- +goose Down
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
    NEW.chain_seq := link.seq;
    NEW.prev_hash := link.prev_hash;
    NEW.hash := link.hash;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
