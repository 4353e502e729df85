-- The first operation an event of type $3 of an operation links to (its detail member $4 names it) that did not
-- fail.
SELECT e.detail->>$4 FROM operation_events e
JOIN operations o ON o.account_id = e.account_id AND o.id = e.detail->>$4
WHERE e.account_id = $1 AND e.operation_id = $2 AND e.type = $3 AND o.state <> 'failed'
ORDER BY e.id LIMIT 1
