-- Drops the stored responses of final operations created before $1 whose own expiry has passed at $2 (the
-- database's now() when NULL, the clock that set the expiry; a test passes its own time); the key stays,
-- expired. The created_at bound makes the scan read only the old part of the table (operations_created, BRIN).
UPDATE operations SET key_state = 'expired', response_headers = NULL, response_body = NULL
WHERE key_state = 'completed' AND created_at < $1 AND response_expires_at < coalesce($2::timestamptz, now())
  AND state IN ('succeeded', 'failed', 'cancelled')
