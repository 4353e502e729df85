-- A local write's claim: its key's lock, held until the transaction ends. A copy of the request sent meanwhile
-- waits here, then reads the key (lookup.sql, the next statement: a new snapshot) and finds it completed. The
-- lock is advisory, on a 64-bit hash of the account and the key (two keys that share a hash only wait for each
-- other); what keeps a key to one operation is still the unique index operations_key, which the insert of the
-- completed operation meets.
SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || $2, 0))
