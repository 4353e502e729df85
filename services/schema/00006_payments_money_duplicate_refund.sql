-- +goose Up
-- A refund the provider executed more than once (duplicate_effect_confirmed) paid out its amount each time. Its
-- row records how many times (executions), and everything that sums refunds counts amount_minor * executions:
-- the intent's refunded total, and what is left to refund, equal what the provider paid out.
ALTER TABLE payment_refunds ADD COLUMN executions integer NOT NULL DEFAULT 1 CHECK (executions >= 1);

-- +goose Down
ALTER TABLE payment_refunds DROP COLUMN executions;
