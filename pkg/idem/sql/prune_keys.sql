-- Keys past their lifetime: only then may the same key run again. created_at < $1 (the lifetime ago) bounds the
-- scan by its index.
DELETE FROM idempotency_keys
WHERE state IN ('completed', 'expired') AND created_at < $1 AND key_expires_at < now()
