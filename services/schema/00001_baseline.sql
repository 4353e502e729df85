-- +goose Up
-- The demo services' tables: tickets, payments, deploys. Keyed by account_id first, as every tenant table
-- (docs/sharding.md).

-- The tickets service's tables (services/tickets).
CREATE TABLE tickets (
    id              text        NOT NULL,
    account_id      text        NOT NULL,
    project         text        NOT NULL,
    title           text        NOT NULL,
    description     text        NOT NULL DEFAULT '',
    priority        text        NOT NULL CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
    status          text        NOT NULL CHECK (status IN ('open', 'resolved', 'closed')),
    source_event_id text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tickets_pkey PRIMARY KEY (account_id, id)
);
-- Business uniqueness: one ticket per source event and account, whatever idempotency key the caller used.
CREATE UNIQUE INDEX tickets_source_event ON tickets (account_id, source_event_id) WHERE source_event_id IS NOT NULL;
CREATE INDEX tickets_account_created ON tickets (account_id, created_at DESC);

CREATE TABLE ticket_comments (
    id         text        NOT NULL,
    ticket_id  text        NOT NULL,
    account_id text        NOT NULL,
    body       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ticket_comments_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT ticket_comments_ticket_id_fkey FOREIGN KEY (account_id, ticket_id) REFERENCES tickets (account_id, id)
);
CREATE INDEX ticket_comments_ticket ON ticket_comments (account_id, ticket_id, created_at);

-- Status changes actually made; a repeated PUT of the same status adds nothing here.
CREATE TABLE ticket_status_changes (
    id          bigserial   NOT NULL,
    ticket_id   text        NOT NULL,
    account_id  text        NOT NULL,
    from_status text        NOT NULL,
    to_status   text        NOT NULL,
    actor       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ticket_status_changes_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT ticket_status_changes_ticket_id_fkey FOREIGN KEY (account_id, ticket_id) REFERENCES tickets (account_id, id)
);
CREATE INDEX ticket_status_changes_ticket ON ticket_status_changes (account_id, ticket_id, id);

-- The payments service's tables (services/payments).
--
-- Payment intents: an amount authorized at the provider for one order, captured at most once. While a capture
-- or a void is at the provider the intent is reserved for that operation (capturing, canceling): the conditional
-- move out of requires_capture is what lets exactly one of many concurrent captures through.
--
-- A capture the provider executed more than once (duplicate_effect_confirmed) took more than the intent meant.
-- The intent records it beside its capture, once a correction names it: captured_minor stays what one execution
-- took (at most amount_minor), duplicate_captured_minor is what the further executions took, and a correction
-- refund (Remediates-Operation-Id, returns_duplicate_capture) returns it into duplicate_refunded_minor. Refunds
-- never exceed what was really captured: refunded_minor <= captured_minor and duplicate_refunded_minor <=
-- duplicate_captured_minor, each checked here.
CREATE TABLE payment_intents (
    id                             text        NOT NULL,
    account_id                     text        NOT NULL,
    order_id                       text        NOT NULL,
    currency                       text        NOT NULL,
    amount_minor                   bigint      NOT NULL CHECK (amount_minor > 0),
    description                    text        NOT NULL DEFAULT '',
    status                         text        NOT NULL CHECK (status IN ('authorizing', 'requires_capture', 'capturing',
                                                                          'canceling', 'succeeded', 'canceled', 'failed')),
    captured_minor                 bigint      NOT NULL DEFAULT 0 CHECK (captured_minor BETWEEN 0 AND amount_minor),
    refunded_minor                 bigint      NOT NULL DEFAULT 0 CHECK (refunded_minor BETWEEN 0 AND captured_minor),
    provider_authorization_id      text,
    create_operation_id            text        NOT NULL,
    -- The capture or cancel operation that holds the intent while its provider call is out.
    pending_operation_id           text,
    created_at                     timestamptz NOT NULL DEFAULT now(),
    updated_at                     timestamptz NOT NULL DEFAULT now(),
    -- The capture that the provider executed more than once, and what its further executions took.
    duplicate_capture_operation_id text,
    duplicate_captured_minor       bigint      NOT NULL DEFAULT 0,
    duplicate_refunded_minor       bigint      NOT NULL DEFAULT 0,
    CHECK ((pending_operation_id IS NOT NULL) = (status IN ('capturing', 'canceling'))),
    CONSTRAINT payment_intents_duplicate_check
        CHECK (duplicate_captured_minor >= 0 AND duplicate_refunded_minor BETWEEN 0 AND duplicate_captured_minor),
    CONSTRAINT payment_intents_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT payment_intents_create_operation_id_key UNIQUE (account_id, create_operation_id),
    CONSTRAINT payment_intents_pending_operation_id_key UNIQUE (account_id, pending_operation_id)
);
-- At most one payable intent per order and account, whatever idempotency key the caller used; a failed or
-- canceled intent frees the order.
CREATE UNIQUE INDEX payment_intents_active_order ON payment_intents (account_id, order_id)
    WHERE status NOT IN ('failed', 'canceled');
CREATE INDEX payment_intents_duplicate_capture ON payment_intents (account_id, duplicate_capture_operation_id)
    WHERE duplicate_capture_operation_id IS NOT NULL;

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
    -- A correction refund: it returns a duplicate capture (into duplicate_refunded_minor), not the capture.
    returns_duplicate_capture boolean NOT NULL DEFAULT false,
    -- A refund the provider executed more than once (duplicate_effect_confirmed) paid out its amount each time:
    -- everything that sums refunds counts amount_minor * executions, so the intent's refunded total and what is
    -- left to refund equal what the provider paid out.
    executions         integer     NOT NULL DEFAULT 1 CHECK (executions >= 1),
    CONSTRAINT payment_refunds_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT payment_refunds_operation_id_key UNIQUE (account_id, operation_id),
    CONSTRAINT payment_refunds_intent_id_fkey FOREIGN KEY (account_id, intent_id) REFERENCES payment_intents (account_id, id)
);
CREATE INDEX payment_refunds_intent ON payment_refunds (account_id, intent_id, created_at);

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
    -- How many times the deploy has been claimed to run: a deploy whose controller died before the target
    -- activated it (the reconciler found no marker) is queued again under the same operation until it has run
    -- deploys.MaxAttempts times, and only then fails.
    attempts             integer     NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    CHECK ((artifact IS NULL) <> (commit_sha IS NULL)),
    CONSTRAINT deploys_pkey PRIMARY KEY (account_id, id),
    CONSTRAINT deploys_operation_id_key UNIQUE (account_id, operation_id),
    -- A deploy request is a local write (package idem): its operation is inserted at the end of its transaction,
    -- completed, after the deploy row that names it, so this key is checked at COMMIT.
    CONSTRAINT deploys_operation_id_fkey FOREIGN KEY (account_id, operation_id) REFERENCES operations (account_id, id)
        DEFERRABLE INITIALLY DEFERRED,
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
    activated_at  timestamptz NOT NULL DEFAULT now(),
    -- The environment version the activation made (the deploy's environment_version + 1): the target knows the
    -- newest version of an environment even when a failover took it from our database (deploys.CatchUp).
    environment_version bigint
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
DROP TABLE payment_restored_effects;
DROP TABLE payment_provider_sweep;
DROP TABLE payment_refunds;
DROP TABLE payment_intents;
DROP TABLE ticket_status_changes;
DROP TABLE ticket_comments;
DROP TABLE tickets;
