-- The operation that holds a key, with what a retry needs: its fingerprint, the key's state and stored response,
-- the operation's state and resource. key_held is the predicate of the unique index operations_key, which this
-- reads by its whole key: one row, whatever the size the table had when the plan was made.
SELECT coalesce(fingerprint, ''), id, key_state, coalesce(response_status, 0), coalesce(response_headers, '{}'),
       response_body, state, resource_type, resource_id
FROM operations
WHERE account_id = $1 AND idempotency_key = $2 AND key_held
