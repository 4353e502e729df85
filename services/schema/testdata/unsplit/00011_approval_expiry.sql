-- +goose Up
-- Expiry is a recorded decision: an approval that runs out (pending, or approved and never used, past
-- expires_at) is moved to state expired, by the approval expiry worker or by a decision that finds it expired,
-- and approvals_audit writes its `expired` record. The UPDATE that moves it names the states it moves from, so
-- of two replicas that race, the second finds it expired already and records nothing: one record per approval.
ALTER TABLE approvals DROP CONSTRAINT approvals_state_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_state_check
    CHECK (state IN ('pending', 'approved', 'denied', 'revoked', 'expired'));
-- The expiry worker's search: the approvals that can still run out.
CREATE INDEX approvals_expiring ON approvals (expires_at) WHERE state IN ('pending', 'approved') AND used_by_operation_id IS NULL;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION approvals_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'requested', NEW.requested_by, jsonb_build_object(
            'method', NEW.method, 'path', NEW.path, 'idempotency_key', NEW.idempotency_key,
            'fingerprint', NEW.fingerprint, 'summary', NEW.summary, 'expires_at', audit_time(NEW.expires_at)));
        RETURN NEW;
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state AND NEW.state = 'expired' THEN
        -- Nobody decided it: time did. decided_by keeps the last person's decision (an approval that expired
        -- approved names its approver).
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'expired', 'system:approval-expiry',
                jsonb_build_object('from_state', OLD.state, 'expires_at', audit_time(NEW.expires_at)));
    ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, NEW.state, coalesce(NEW.decided_by, 'unknown'),
                jsonb_build_object('from_state', OLD.state));
    END IF;
    IF NEW.used_by_operation_id IS DISTINCT FROM OLD.used_by_operation_id THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'used', 'system:approval', jsonb_build_object('operation_id', NEW.used_by_operation_id));
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION approvals_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'requested', NEW.requested_by, jsonb_build_object(
            'method', NEW.method, 'path', NEW.path, 'idempotency_key', NEW.idempotency_key,
            'fingerprint', NEW.fingerprint, 'summary', NEW.summary, 'expires_at', audit_time(NEW.expires_at)));
        RETURN NEW;
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, NEW.state, coalesce(NEW.decided_by, 'unknown'),
                jsonb_build_object('from_state', OLD.state));
    END IF;
    IF NEW.used_by_operation_id IS DISTINCT FROM OLD.used_by_operation_id THEN
        INSERT INTO approval_events (approval_id, account_id, type, actor, detail)
        VALUES (NEW.id, NEW.account_id, 'used', 'system:approval', jsonb_build_object('operation_id', NEW.used_by_operation_id));
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
DROP INDEX approvals_expiring;
-- An expired approval reads expired anyway (past expires_at); pending is the state it ran out in.
UPDATE approvals SET state = 'pending' WHERE state = 'expired' AND decided_by IS NULL;
UPDATE approvals SET state = 'approved' WHERE state = 'expired';
ALTER TABLE approvals DROP CONSTRAINT approvals_state_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_state_check CHECK (state IN ('pending', 'approved', 'denied', 'revoked'));
