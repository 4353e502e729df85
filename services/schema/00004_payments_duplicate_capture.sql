-- +goose Up
-- A capture the provider executed more than once (duplicate_effect_confirmed) took more than the intent meant.
-- The intent records it beside its capture, once a correction names it: captured_minor stays what one execution
-- took (at most amount_minor), duplicate_captured_minor is what the further executions took, and a correction
-- refund (Remediates-Operation-Id, returns_duplicate_capture) returns it into duplicate_refunded_minor. Refunds
-- never exceed what was really captured: refunded_minor <= captured_minor and duplicate_refunded_minor <=
-- duplicate_captured_minor, each checked here.
ALTER TABLE payment_intents
    ADD COLUMN duplicate_capture_operation_id text,
    ADD COLUMN duplicate_captured_minor       bigint NOT NULL DEFAULT 0,
    ADD COLUMN duplicate_refunded_minor       bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT payment_intents_duplicate_check
        CHECK (duplicate_captured_minor >= 0 AND duplicate_refunded_minor BETWEEN 0 AND duplicate_captured_minor);
CREATE INDEX payment_intents_duplicate_capture ON payment_intents (account_id, duplicate_capture_operation_id)
    WHERE duplicate_capture_operation_id IS NOT NULL;
ALTER TABLE payment_refunds ADD COLUMN returns_duplicate_capture boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE payment_refunds DROP COLUMN returns_duplicate_capture;
DROP INDEX payment_intents_duplicate_capture;
ALTER TABLE payment_intents
    DROP CONSTRAINT payment_intents_duplicate_check,
    DROP COLUMN duplicate_refunded_minor,
    DROP COLUMN duplicate_captured_minor,
    DROP COLUMN duplicate_capture_operation_id;
