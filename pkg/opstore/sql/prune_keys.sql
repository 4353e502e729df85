-- Gives up the keys of final operations created before $1 whose key expiry has passed: the same key would then
-- run again.
UPDATE operations SET key_state = NULL, response_headers = NULL, response_body = NULL
WHERE key_state IN ('completed', 'expired') AND created_at < $1 AND key_expires_at < now()
  AND state IN ('succeeded', 'failed', 'cancelled')
