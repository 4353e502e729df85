-- scripts/bench-db-steps.sh (pgbench): the key's read that serves retries, for client :client_id's key :r.
SELECT coalesce(fingerprint, ''), id, key_state, coalesce(response_status, 0), coalesce(response_headers, '{}'), response_body, state, resource_type, resource_id FROM operations WHERE account_id = 'acct_a' AND idempotency_key = 'k_' || :client_id::text || '_' || :r::text AND key_held;
