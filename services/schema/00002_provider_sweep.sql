-- +goose Up
-- What the payments sweep (services/payments/heal.go) last saw, one row: the database's timeline, so that a
-- promoted standby (a new timeline) is noticed by every process even across restarts, and the provider time
-- through which every provider effect was found with its rows. It lives in the database it describes: a failover
-- that loses the newest commits loses the newest sweep with them, and the next sweep looks again from before them.
CREATE TABLE payment_provider_sweep (
    singleton     boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    timeline_id   bigint      NOT NULL,
    matched_until timestamptz NOT NULL,
    swept_at      timestamptz NOT NULL DEFAULT now()
);

-- One row per provider effect the sweep restored, found by the provider key of the call: a retry of the lost
-- request under its Idempotency-Key derives the same key and adopts what was restored (adopted_by, its operation)
-- instead of reserving and booking it a second time.
CREATE TABLE payment_restored_effects (
    account_id    text        NOT NULL,
    provider_key  text        NOT NULL,
    operation_id  text        NOT NULL,
    resource_type text        NOT NULL CHECK (resource_type IN ('payment_intent', 'refund')),
    resource_id   text        NOT NULL,
    adopted_by    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT payment_restored_effects_pkey PRIMARY KEY (account_id, provider_key)
);
CREATE INDEX payment_restored_effects_adopted ON payment_restored_effects (account_id, adopted_by) WHERE adopted_by IS NOT NULL;

-- +goose Down
DROP TABLE payment_restored_effects;
DROP TABLE payment_provider_sweep;
