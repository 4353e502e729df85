-- The owner marked on an operation's claim when no session holds that owner's advisory lock (class $3) and the
-- operation has no dispatch_started record; no row otherwise (no owner marked, owner alive, or a call started).
SELECT c.owner FROM (
    SELECT (detail->>'owner')::bigint AS owner FROM operation_events
    WHERE account_id = $1 AND operation_id = $2 AND type = 'claimed' AND detail->>'owner' IS NOT NULL) c
WHERE NOT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid::bigint = $3 AND l.objid::bigint = c.owner
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
  AND NOT EXISTS (
        SELECT 1 FROM operation_events d
        WHERE d.account_id = $1 AND d.operation_id = $2 AND d.type = 'dispatch_started')
