-- +goose Up
-- The payments service's tables (services/payments).
--
-- Payment intents: an amount authorized at the provider for one order, captured at most once. While a capture
-- or a void is at the provider the intent is reserved for that operation (capturing, canceling): the conditional
-- move out of requires_capture is what lets exactly one of many concurrent captures through.
CREATE TABLE payment_intents (
    id                        text        NOT NULL,
    account_id                text        NOT NULL,
    order_id                  text        NOT NULL,
    currency                  text        NOT NULL,
    amount_minor              bigint      NOT NULL CHECK (amount_minor > 0),
    description               text        NOT NULL DEFAULT '',
    status                    text        NOT NULL CHECK (status IN ('authorizing', 'requires_capture', 'capturing',
                                                                     'canceling', 'succeeded', 'canceled', 'failed')),
    captured_minor            bigint      NOT NULL DEFAULT 0 CHECK (captured_minor BETWEEN 0 AND amount_minor),
    refunded_minor            bigint      NOT NULL DEFAULT 0 CHECK (refunded_minor BETWEEN 0 AND captured_minor),
    provider_authorization_id text,
    create_operation_id       text        NOT NULL,
    -- The capture or cancel operation that holds the intent while its provider call is out.
    pending_operation_id      text,
    created_at                timestamptz NOT NULL DEFAULT now(),
    updated_at                timestamptz NOT NULL DEFAULT now(),
    CHECK ((pending_operation_id IS NOT NULL) = (status IN ('capturing', 'canceling'))),
    CONSTRAINT payment_intents_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT payment_intents_create_operation_id_key UNIQUE (account_id, create_operation_id),
    CONSTRAINT payment_intents_pending_operation_id_key UNIQUE (account_id, pending_operation_id)
);
-- At most one payable intent per order and account, whatever idempotency key the caller used; a failed or
-- canceled intent frees the order.
CREATE UNIQUE INDEX payment_intents_active_order ON payment_intents (account_id, order_id)
    WHERE status NOT IN ('failed', 'canceled');

-- Refunds: each one its own operation. A pending refund holds its amount against the captured total until the
-- provider's answer is recorded; a failed one releases it.
CREATE TABLE payment_refunds (
    id                 text        NOT NULL,
    account_id         text        NOT NULL,
    intent_id          text        NOT NULL,
    currency           text        NOT NULL,
    amount_minor       bigint      NOT NULL CHECK (amount_minor > 0),
    reason             text        NOT NULL DEFAULT '',
    status             text        NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    provider_refund_id text,
    operation_id       text        NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT payment_refunds_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT payment_refunds_operation_id_key UNIQUE (account_id, operation_id),
    CONSTRAINT payment_refunds_intent_id_fkey FOREIGN KEY (account_id, intent_id) REFERENCES payment_intents (account_id, id)
);
CREATE INDEX payment_refunds_intent ON payment_refunds (account_id, intent_id, created_at);

-- +goose Down
DROP TABLE payment_refunds;
DROP TABLE payment_intents;
