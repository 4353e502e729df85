-- +goose Up
-- How many times a deploy has been claimed to run: a deploy whose controller died before the target activated
-- it (the reconciler found no marker) is queued again under the same operation until it has run
-- deploys.MaxAttempts times, and only then fails.
ALTER TABLE deploys ADD COLUMN attempts integer NOT NULL DEFAULT 1 CHECK (attempts >= 1);

-- The environment version an activation made (the deploy's environment_version + 1): the target knows the
-- newest version of an environment even when a failover took it from our database (deploys.CatchUp).
ALTER TABLE deploy_target_activations ADD COLUMN environment_version bigint;

-- +goose Down
ALTER TABLE deploy_target_activations DROP COLUMN environment_version;
ALTER TABLE deploys DROP COLUMN attempts;
