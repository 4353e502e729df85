-- +goose Up
-- The deploys service's tables (services/deploys) and its simulated deploy target.
--
-- Environments come into being with their first accepted deploy. version counts successful deploys; an agent
-- passes the version it planned against as expected_environment_version.
CREATE TABLE environments (
    account_id         text        NOT NULL,
    name               text        NOT NULL,
    version            bigint      NOT NULL DEFAULT 0,
    current_deploy_id  text,
    current_artifact   text,
    current_commit_sha text,
    -- The deploy that was current before current_deploy_id: what a rollback of the current deploy returns to.
    previous_deploy_id text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, name)
);

CREATE TABLE deploys (
    id                   text        NOT NULL,
    account_id           text        NOT NULL,
    operation_id         text        NOT NULL,
    kind                 text        NOT NULL CHECK (kind IN ('deploy', 'rollback')),
    service              text        NOT NULL,
    environment          text        NOT NULL,
    artifact             text,
    commit_sha           text,
    rolls_back_deploy_id text,
    -- unknown is never stored here: it is the operation's state while the reconciler has not settled it.
    state                text        NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    -- The environment version the deploy was planned on; success makes the environment environment_version + 1.
    environment_version  bigint      NOT NULL,
    -- The release lock's fencing token this deploy acquired; every write of the controller checks it.
    fencing_token        bigint      NOT NULL,
    steps_total          integer     NOT NULL,
    steps_completed      integer     NOT NULL DEFAULT 0,
    -- Set when the controller starts activating on the target: from then on the deploy can no longer be
    -- cancelled, only settled by the controller or, if it dies, by the reconciler from the target's marker.
    activation_started_at timestamptz,
    started_at           timestamptz,
    finished_at          timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- When the deploy last entered the queue (accepted, or put back at a controller's shutdown): a deploy queued
    -- longer than DEPLOY_QUEUE_TIMEOUT fails with reason queue_timeout and frees its environment's lock.
    queued_at            timestamptz NOT NULL DEFAULT now(),
    CHECK ((artifact IS NULL) <> (commit_sha IS NULL)),
    CONSTRAINT deploys_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT deploys_operation_id_key UNIQUE (account_id, operation_id),
    CONSTRAINT deploys_operation_id_fkey FOREIGN KEY (account_id, operation_id) REFERENCES operations (account_id, id),
    CONSTRAINT deploys_rolls_back_deploy_id_fkey
        FOREIGN KEY (account_id, rolls_back_deploy_id) REFERENCES deploys (account_id, id),
    FOREIGN KEY (account_id, environment) REFERENCES environments (account_id, name)
);
CREATE INDEX deploys_queued ON deploys (queued_at, id) WHERE state = 'queued';
CREATE INDEX deploys_account_active ON deploys (account_id, state, queued_at, id) WHERE state IN ('queued', 'running');
CREATE INDEX deploys_environment ON deploys (account_id, environment, created_at);

-- The release lock: one row per (account, environment), held by at most one deploy while it is queued or
-- running. fencing_token grows on every acquisition and takeover and never goes back, so a worker holding an
-- older token can no longer change anything. lease_expires_at is NULL while the holder waits in the queue and
-- renewed by the controller's heartbeat while it runs.
CREATE TABLE environment_locks (
    account_id       text        NOT NULL,
    environment      text        NOT NULL,
    holder_deploy_id text,
    fencing_token    bigint      NOT NULL,
    acquired_at      timestamptz,
    lease_expires_at timestamptz,
    PRIMARY KEY (account_id, environment),
    FOREIGN KEY (account_id, environment) REFERENCES environments (account_id, name),
    CONSTRAINT environment_locks_holder_deploy_id_fkey
        FOREIGN KEY (account_id, holder_deploy_id) REFERENCES deploys (account_id, id) DEFERRABLE INITIALLY DEFERRED
);

-- Fair sharing of the deploy controller between accounts (services/deploys ClaimQueued, ExpireQueued): one row
-- per account that has ever queued a deploy. A claimer locks it (FOR UPDATE SKIP LOCKED) before it counts the
-- account's running deploys and starts one, so several controllers can never start more than the per-account cap
-- between them; last_started_at orders the accounts with queued work, oldest start first (round robin). Taken
-- before any row of deploys.
CREATE TABLE deploy_accounts (
    account_id      text PRIMARY KEY,
    last_started_at timestamptz
);

-- The simulated deploy target: a remote system, written outside the deploys' transactions. It records, keyed
-- by deploy id, what it activated (the marker the reconciler reads), and refuses activations that carry a
-- fencing token older than the newest one it has seen for the environment. No foreign keys: it is not ours.
CREATE TABLE deploy_target_activations (
    deploy_id     text PRIMARY KEY,
    account_id    text        NOT NULL,
    environment   text        NOT NULL,
    service       text        NOT NULL,
    artifact      text,
    commit_sha    text,
    fencing_token bigint      NOT NULL,
    -- How many times Activate was called for this deploy: tests assert it never exceeds one.
    calls         integer     NOT NULL DEFAULT 1,
    activated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE deploy_target_fences (
    account_id    text   NOT NULL,
    environment   text   NOT NULL,
    fencing_token bigint NOT NULL,
    PRIMARY KEY (account_id, environment)
);

-- +goose Down
DROP TABLE deploy_target_fences;
DROP TABLE deploy_target_activations;
DROP TABLE deploy_accounts;
DROP TABLE environment_locks;
DROP TABLE deploys;
DROP TABLE environments;
