-- A key with its operation's state, and its resource once the stored response is gone (state 'expired'). These are
-- subqueries on the operation's whole key, not a join:
-- with the account known, a join lets the planner scan the account's operations and filter them by id, and a
-- generic plan made while the tables were small does exactly that (TestLookupPlanReadsOneOperation).
SELECT k.fingerprint, k.operation_id, k.state, coalesce(k.response_status, 0), coalesce(k.response_headers, '{}'),
       k.response_body,
       coalesce((SELECT o.state FROM operations o WHERE o.account_id = k.account_id AND o.id = k.operation_id), ''),
       CASE WHEN k.state = 'expired' THEN
           (SELECT o.resource_type FROM operations o WHERE o.account_id = k.account_id AND o.id = k.operation_id) END,
       CASE WHEN k.state = 'expired' THEN
           (SELECT o.resource_id FROM operations o WHERE o.account_id = k.account_id AND o.id = k.operation_id) END
FROM idempotency_keys k
WHERE k.account_id = $1 AND k.idempotency_key = $2
