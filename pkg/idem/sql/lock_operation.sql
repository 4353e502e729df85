-- The operation's row, locked until the transaction ends. FOR NO KEY UPDATE, not FOR UPDATE: an event insert
-- holds its chain head (audit trigger) and then takes KEY SHARE on the operation for its foreign key; FOR UPDATE
-- would conflict with that and deadlock.
SELECT 1 FROM operations WHERE account_id = $1 AND id = $2 FOR NO KEY UPDATE
