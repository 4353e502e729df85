-- +goose Up
-- How many times a deploy has been claimed to run: a deploy whose controller died before the target activated
-- it (the reconciler found no marker) is queued again under the same operation until it has run
-- deploys.MaxAttempts times, and only then fails.
ALTER TABLE deploys ADD COLUMN attempts integer NOT NULL DEFAULT 1 CHECK (attempts >= 1);

-- +goose Down
ALTER TABLE deploys DROP COLUMN attempts;
