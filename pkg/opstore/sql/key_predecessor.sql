-- The newest operation started under the key before $3 (ids are time-ordered UUIDv7s, compared byte by byte
-- whatever the database's collation) that completed and gave the key up at the end of its lifetime: key_state
-- NULL with a completion, unlike a claim released before its effect was sent (no completion). Read through
-- operations_released_key.
SELECT id FROM operations
WHERE account_id = $1 AND idempotency_key = $2 AND NOT key_held AND id COLLATE "C" < $3 AND completed_at IS NOT NULL
ORDER BY id COLLATE "C" DESC LIMIT 1
