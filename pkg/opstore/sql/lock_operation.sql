-- The operation's row, locked until the transaction ends. FOR NO KEY UPDATE, not FOR UPDATE: an event insert
-- takes KEY SHARE on the operation for its foreign key, which FOR UPDATE would make wait for this transaction.
SELECT 1 FROM operations WHERE account_id = $1 AND id = $2 FOR NO KEY UPDATE
