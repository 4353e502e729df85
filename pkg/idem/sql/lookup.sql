-- A key with its operation's state. The state is a subquery on the operation's whole key, not a join: with the
-- account known, a join lets the planner scan the account's operations and filter them by id, and a generic plan
-- made while the tables were small does exactly that (TestLookupPlanReadsOneOperation).
SELECT k.fingerprint, k.operation_id, k.state, k.response_status, k.response_headers::text, k.response_body,
       (SELECT o.state FROM operations o WHERE o.account_id = k.account_id AND o.id = k.operation_id) AS operation_state
FROM idempotency_keys k
WHERE k.account_id = $1 AND k.idempotency_key = $2
