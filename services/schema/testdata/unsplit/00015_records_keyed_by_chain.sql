-- +goose Up
-- Records are always read by their chain (an operation's events, an approval's decisions), in storage order, and
-- never by id alone: the primary key becomes that order, (account_id, chain, id), and the separate index with
-- the same columns goes. One index entry fewer for every record written (two per ticket create, one per replay
-- record); still keyed by account first (migrations/shard_test.go), and id stays unique within the key.
ALTER TABLE operation_events DROP CONSTRAINT operation_events_pkey,
    ADD CONSTRAINT operation_events_pkey PRIMARY KEY (account_id, operation_id, id);
DROP INDEX operation_events_operation;
ALTER TABLE approval_events DROP CONSTRAINT approval_events_pkey,
    ADD CONSTRAINT approval_events_pkey PRIMARY KEY (account_id, approval_id, id);
DROP INDEX approval_events_approval;

-- +goose Down
CREATE INDEX approval_events_approval ON approval_events (account_id, approval_id, id);
ALTER TABLE approval_events DROP CONSTRAINT approval_events_pkey, ADD CONSTRAINT approval_events_pkey PRIMARY KEY (account_id, id);
CREATE INDEX operation_events_operation ON operation_events (account_id, operation_id, id);
ALTER TABLE operation_events DROP CONSTRAINT operation_events_pkey, ADD CONSTRAINT operation_events_pkey PRIMARY KEY (account_id, id);
