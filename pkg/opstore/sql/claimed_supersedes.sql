-- The operation the claim of an operation said it supersedes ('' when none): what a later request with the same
-- key and a Supersedes-Operation-Id header must repeat. The claim's detail is on the operation's first record.
SELECT coalesce(max(detail->>'supersedes_operation_id'), '')
FROM operation_events WHERE account_id = $1 AND operation_id = $2 AND type IN ('claimed', 'completed')
