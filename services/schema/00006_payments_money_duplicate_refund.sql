-- +goose Up
-- A refund the provider executed more than once (duplicate_effect_confirmed) paid out its amount each time. Its
-- row records how many times (executions), and everything that sums refunds counts amount_minor * executions:
-- the intent's refunded total, and what is left to refund, equal what the provider paid out.
ALTER TABLE payment_refunds ADD COLUMN executions integer NOT NULL DEFAULT 1 CHECK (executions >= 1);

-- Such refunds settled before were left pending, their intent's refunded total without them. They are booked
-- here as the reconciler books them now (services/payments, recordDuplicatedRefund), from the evidence their
-- settlement rests on: the newest provider_lookup of the operation, whose effects are one id per execution. A
-- correction of a duplicated capture returns into duplicate_refunded_minor up to duplicate_captured_minor, the
-- rest into refunded_minor.
WITH dup AS (
    SELECT r.account_id, r.id, e.executions, e.first_id
    FROM payment_refunds r
    JOIN operations o ON o.account_id = r.account_id AND o.id = r.operation_id AND o.state = 'duplicate_effect_confirmed'
    CROSS JOIN LATERAL (
        SELECT jsonb_array_length(ev.detail->'effects') AS executions, ev.detail->'effects'->>0 AS first_id
        FROM operation_events ev
        WHERE ev.account_id = r.account_id AND ev.operation_id = r.operation_id AND ev.type = 'provider_lookup'
          AND jsonb_typeof(ev.detail->'effects') = 'array'
        ORDER BY ev.id DESC LIMIT 1
    ) e
    WHERE r.status = 'pending' AND e.executions > 1
), booked AS (
    UPDATE payment_refunds r
    SET status = 'succeeded', executions = dup.executions, provider_refund_id = dup.first_id, updated_at = now()
    FROM dup WHERE r.account_id = dup.account_id AND r.id = dup.id
    RETURNING r.account_id, r.intent_id, r.amount_minor * r.executions AS total, r.returns_duplicate_capture
), paid AS (
    SELECT b.account_id, b.intent_id, sum(b.total) AS total,
           LEAST(COALESCE(sum(b.total) FILTER (WHERE b.returns_duplicate_capture), 0),
                 max(i.duplicate_captured_minor - i.duplicate_refunded_minor)) AS to_duplicate
    FROM booked b JOIN payment_intents i ON i.account_id = b.account_id AND i.id = b.intent_id
    GROUP BY b.account_id, b.intent_id
)
UPDATE payment_intents i
SET refunded_minor = refunded_minor + paid.total - paid.to_duplicate,
    duplicate_refunded_minor = duplicate_refunded_minor + paid.to_duplicate,
    updated_at = now()
FROM paid WHERE i.account_id = paid.account_id AND i.id = paid.intent_id;

-- +goose Down
ALTER TABLE payment_refunds DROP COLUMN executions;
