-- +goose Up
-- An operation's lineage is held by the database, not only checked before a write (package idem), so requests
-- that race past the check cannot both write:
--   operation_events_successor: an operation has at most one superseded event, so one successor.
--   operation_events_attempt: an attempt id has at most one attempt record in an operation.
-- The loser of a race meets the index (after waiting for the winner's transaction) and is refused, its write
-- rolled back.
--
-- Records are never changed or deleted, so a database written before this migration may already hold such
-- repeats. Then an index covers only the records written after the last of them (id > it); otherwise all.
-- +goose StatementBegin
DO $$
DECLARE
    successor_repeat bigint;
    attempt_repeat   bigint;
BEGIN
    SELECT max(id) INTO successor_repeat FROM (
        SELECT id, row_number() OVER (PARTITION BY account_id, operation_id ORDER BY id) AS n
        FROM operation_events WHERE type = 'superseded') e
    WHERE n > 1;
    SELECT max(id) INTO attempt_repeat FROM (
        SELECT id, row_number() OVER (PARTITION BY account_id, operation_id, detail->>'attempt_id' ORDER BY id) AS n
        FROM operation_events WHERE is_attempt_record(detail)) e
    WHERE n > 1;
    EXECUTE 'CREATE UNIQUE INDEX operation_events_successor ON operation_events (account_id, operation_id) '
        'WHERE type = ''superseded''' || coalesce(' AND id > ' || successor_repeat, '');
    EXECUTE 'CREATE UNIQUE INDEX operation_events_attempt ON operation_events (account_id, operation_id, (detail->>''attempt_id'')) '
        'WHERE is_attempt_record(detail)' || coalesce(' AND id > ' || attempt_repeat, '');
END $$;
-- +goose StatementEnd

-- +goose Down
DROP INDEX operation_events_attempt;
DROP INDEX operation_events_successor;
