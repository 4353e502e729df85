-- Moves the lease of a queued or running operation; no row for one in another state.
UPDATE operations SET lease_expires_at = $3
WHERE account_id = $1 AND id = $2 AND state IN ('queued', 'running')
