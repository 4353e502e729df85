-- +goose Up
-- Fair sharing of the deploy controller between accounts (services/deploys ClaimQueued, ExpireQueued).

-- One row per account that has ever queued a deploy. A claimer locks it (FOR UPDATE SKIP LOCKED) before it
-- counts the account's running deploys and starts one, so several controllers can never start more than the
-- per-account cap between them; last_started_at orders the accounts with queued work, oldest start first
-- (round robin). Taken before any row of deploys.
CREATE TABLE deploy_accounts (
    account_id      text PRIMARY KEY,
    last_started_at timestamptz
);
INSERT INTO deploy_accounts (account_id, last_started_at)
SELECT account_id, max(started_at) FROM deploys GROUP BY account_id;

-- When the deploy last entered the queue (accepted, or put back at a controller's shutdown): a deploy queued
-- longer than DEPLOY_QUEUE_TIMEOUT fails with reason queue_timeout and frees its environment's lock.
ALTER TABLE deploys ADD COLUMN queued_at timestamptz NOT NULL DEFAULT now();
UPDATE deploys SET queued_at = created_at;

DROP INDEX deploys_queued;
CREATE INDEX deploys_queued ON deploys (queued_at, id) WHERE state = 'queued';
-- An account's queued and running deploys: what a claim counts and picks from.
CREATE INDEX deploys_account_active ON deploys (account_id, state, queued_at, id) WHERE state IN ('queued', 'running');

-- +goose Down
DROP INDEX deploys_account_active;
DROP INDEX deploys_queued;
CREATE INDEX deploys_queued ON deploys (created_at) WHERE state = 'queued';
ALTER TABLE deploys DROP COLUMN queued_at;
DROP TABLE deploy_accounts;
