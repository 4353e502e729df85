-- Appends dispatch_started only while the operation is running. FOR SHARE makes it wait for a transaction that
-- holds the operation's row (a release under the row lock, owner_gone.sql) and then see the state that one
-- committed: a release and a dispatch never both go through.
WITH op AS (
    SELECT id, account_id FROM operations WHERE account_id = $1 AND id = $2 AND state = 'running' FOR SHARE
)
INSERT INTO operation_events (operation_id, account_id, type, actor, detail)
SELECT op.id, op.account_id, $3, $4, $5::jsonb FROM op
