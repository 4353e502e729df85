-- What autovacuum would have done to the store's tables after the growth run's preload: visibility map and
-- statistics.
VACUUM (ANALYZE) operations, operation_events
