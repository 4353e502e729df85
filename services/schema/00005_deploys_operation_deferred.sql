-- +goose Up
-- A deploy request is a local write (package idem): its operation is inserted at the end of its transaction,
-- completed, after the deploy row that names it. The deploy's foreign key to its operation is checked at COMMIT.
ALTER TABLE deploys ALTER CONSTRAINT deploys_operation_id_fkey DEFERRABLE INITIALLY DEFERRED;

-- +goose Down
ALTER TABLE deploys ALTER CONSTRAINT deploys_operation_id_fkey NOT DEFERRABLE;
