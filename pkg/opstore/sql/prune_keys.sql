-- Gives up the keys of final operations created before $1 whose key expiry has passed at $2 (the database's
-- now() when NULL: it set the expiry, so no process's clock skew shortens a key's life; a test passes its own
-- time): the same key would then run again.
UPDATE operations SET key_state = NULL, response_headers = NULL, response_body = NULL
WHERE key_state IN ('completed', 'expired') AND created_at < $1 AND key_expires_at < coalesce($2::timestamptz, now())
  AND state IN ('succeeded', 'failed', 'cancelled')
