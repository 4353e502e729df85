-- The state of an operation a retry found unknown, its row held FOR SHARE until the retry's transaction ends:
-- a settlement, which takes FOR NO KEY UPDATE, waits for the retry's record and its read of the operation, so
-- the answer shows the state the record was written in.
SELECT state FROM operations WHERE account_id = $1 AND id = $2 FOR SHARE
