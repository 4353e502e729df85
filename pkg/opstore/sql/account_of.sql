-- The account of an operation known by its id alone: a scan of every account (on a sharded database, every
-- shard). Only an operator's tool asks this.
SELECT account_id FROM operations WHERE id = $1 LIMIT 1
