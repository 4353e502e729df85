-- What an approver must see of an operation a write would supersede: its intent (kind, idempotency key and the
-- resource it acted on), its state, its last dispatch (the
-- newest dispatch_* event: dispatch_started alone means the call's end was never recorded) and the newest reason
-- any of its events gives.
SELECT o.kind, o.state, coalesce(o.idempotency_key, '') AS idempotency_key,
       coalesce(o.resource_type, '') AS resource_type, coalesce(o.resource_id, '') AS resource_id,
       (SELECT e.type FROM operation_events e WHERE e.account_id = o.account_id AND e.operation_id = o.id
          AND e.type LIKE 'dispatch\_%' ORDER BY e.id DESC LIMIT 1) AS dispatch,
       (SELECT e.detail->>'reason' FROM operation_events e WHERE e.account_id = o.account_id AND e.operation_id = o.id
          AND e.detail->>'reason' IS NOT NULL ORDER BY e.id DESC LIMIT 1) AS reason
FROM operations o WHERE o.account_id = $1 AND o.id = $2
