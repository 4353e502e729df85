-- The operation that holds a key (key_state is set only on that one: operations_key), with what a retry needs:
-- its fingerprint, the key's state and stored response, the operation's state and resource.
SELECT coalesce(fingerprint, ''), id, key_state, coalesce(response_status, 0), coalesce(response_headers, '{}'),
       response_body, state, resource_type, resource_id
FROM operations
WHERE account_id = $1 AND idempotency_key = $2 AND key_state IS NOT NULL
