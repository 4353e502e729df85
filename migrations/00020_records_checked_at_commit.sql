-- +goose Up
-- A local write's operation is inserted at the end of its transaction, completed (package idem). A record the
-- write appends to its operation before then (an approval checked, a ticket found already there) names an
-- operation not inserted yet: the records' foreign key to their operation is checked at COMMIT. No row is read
-- again: only the constraint's timing changes.
ALTER TABLE operation_events ALTER CONSTRAINT operation_events_operation_id_fkey DEFERRABLE INITIALLY DEFERRED;

-- +goose Down
ALTER TABLE operation_events ALTER CONSTRAINT operation_events_operation_id_fkey NOT DEFERRABLE;
