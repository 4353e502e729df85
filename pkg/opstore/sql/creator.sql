-- The first operation of kind $2, other than $4, that succeeded creating resource ($3, $5) and did not itself
-- record an event of type $6 (it was not answered as a duplicate of another).
SELECT o.id FROM operations o
WHERE o.account_id = $1 AND o.kind = $2 AND o.resource_type = $3 AND o.resource_id = $5 AND o.state = 'succeeded'
  AND o.id <> $4
  AND NOT EXISTS (SELECT 1 FROM operation_events e
                  WHERE e.account_id = o.account_id AND e.operation_id = o.id AND e.type = $6)
ORDER BY o.created_at, o.id LIMIT 1
