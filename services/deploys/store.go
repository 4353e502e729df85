package deploys

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// PostgresStore is the Store on gorm + PostgreSQL.
//
// Every transaction that touches several of these rows takes them in one order, deploy_accounts, environments,
// deploys, environment_locks, operations, so that a request, a cancel, a claim, a controller write, the queue
// timeout and the reconciler can never deadlock. (CreateDeploy inserts its deploy after taking the lock: a row
// no other transaction can see yet; its insert into deploy_accounts does nothing to an existing row, so it
// waits on no claimer.)
type PostgresStore struct{}

var _ Store = PostgresStore{}

// lockRetryAfter is the Retry-After, in seconds, of 409 environment_locked.
const lockRetryAfter = 5

// deployRow is a deploy as selected; State is what callers see (unknown while the operation is), StoredState
// the column.
type deployRow struct {
	Deploy
	StoredState State
}

// The operation's state is read by its whole key (operation_state, migrations/00001_baseline.sql), not a join:
// with the account known, a join lets the planner scan the account's operations and filter them by id.
const deployColumns = `d.id, d.account_id, d.operation_id, d.kind, d.service, d.environment, d.artifact,
d.commit_sha, d.rolls_back_deploy_id,
CASE WHEN operation_state(d.account_id, d.operation_id) = 'unknown'
     THEN 'unknown' ELSE d.state END AS state,
d.state AS stored_state, d.environment_version, d.fencing_token, d.steps_total, d.steps_completed,
d.activation_started_at AS activation_started, d.started_at, d.finished_at, d.created_at, d.updated_at`

const selectDeploy = `SELECT ` + deployColumns + ` FROM deploys d `

// CreateDeploy implements Store. The environment row, locked FOR UPDATE, serializes every deploy request of an
// environment; the lock row decides between them in one statement.
func (s PostgresStore) CreateDeploy(ctx context.Context, tx *gorm.DB, nd NewDeploy) (Deploy, error) {
	db := tx.WithContext(ctx)
	version, err := lockEnvironment(db, nd)
	if err != nil {
		return Deploy{}, err
	}
	id := nd.ID
	if id == "" {
		id = ids.New("dep_")
	}
	token, err := acquireEnvironmentLock(db, nd, id)
	if err != nil {
		return Deploy{}, err
	}
	var rows []deployRow
	err = db.Raw(`
WITH d AS (
    INSERT INTO deploys (id, account_id, operation_id, kind, service, environment, artifact, commit_sha,
                         rolls_back_deploy_id, state, environment_version, fencing_token, steps_total)
    VALUES (?, ?, ?, ?, ?, ?, NULLIF(?, ''), NULLIF(?, ''), ?, 'queued', ?, ?, ?)
    RETURNING *
)
SELECT `+deployColumns+` FROM d`,
		id, nd.AccountID, nd.OperationID, nd.Kind, nd.Service, nd.Environment, nd.Artifact, nd.CommitSHA,
		nd.RollsBackDeployID, version, token, nd.StepsTotal).Scan(&rows).Error
	if err != nil {
		return Deploy{}, fmt.Errorf("deploys: insert: %w", err)
	}
	return rows[0].Deploy, nil
}

// lockEnvironment creates the account and environment rows if need be, locks the environment row FOR UPDATE,
// and returns its version. Returns 409 environment_version_mismatch if nd expected another version, and 409
// invalid_state if nd rolls back a deploy that is no longer the environment's current one.
func lockEnvironment(db *gorm.DB, nd NewDeploy) (int64, error) {
	if err := db.Exec(`INSERT INTO deploy_accounts (account_id) VALUES (?) ON CONFLICT DO NOTHING`, nd.AccountID).Error; err != nil {
		return 0, fmt.Errorf("deploys: register account: %w", err)
	}
	if err := db.Exec(`INSERT INTO environments (account_id, name) VALUES (?, ?) ON CONFLICT DO NOTHING`,
		nd.AccountID, nd.Environment).Error; err != nil {
		return 0, fmt.Errorf("deploys: create environment: %w", err)
	}
	var env []struct {
		Version         int64
		CurrentDeployID *string
	}
	if err := db.Raw(`SELECT version, current_deploy_id FROM environments WHERE account_id = ? AND name = ? FOR UPDATE`,
		nd.AccountID, nd.Environment).Scan(&env).Error; err != nil {
		return 0, fmt.Errorf("deploys: lock environment: %w", err)
	}
	if len(env) != 1 {
		return 0, fmt.Errorf("deploys: environment %q vanished", nd.Environment)
	}
	version := env[0].Version
	if nd.ExpectedEnvironmentVersion != nil && *nd.ExpectedEnvironmentVersion != version {
		return 0, versionMismatch(nd.Environment, version, *nd.ExpectedEnvironmentVersion)
	}
	if nd.RollsBackDeployID != nil && (env[0].CurrentDeployID == nil || *env[0].CurrentDeployID != *nd.RollsBackDeployID) {
		return 0, problem.New("invalid_state",
			"deploy %s is no longer the current deploy of environment %s", *nd.RollsBackDeployID, nd.Environment)
	}
	return version, nil
}

// acquireEnvironmentLock gives the environment's lock to the deploy id, in one statement, and returns its new
// fencing token. Returns 409 environment_locked, naming the holder, if another deploy holds it.
func acquireEnvironmentLock(db *gorm.DB, nd NewDeploy, id string) (int64, error) {
	var token []int64
	err := db.Raw(`
INSERT INTO environment_locks (account_id, environment, holder_deploy_id, fencing_token, acquired_at)
VALUES (?, ?, ?, 1, now())
ON CONFLICT (account_id, environment) DO UPDATE
SET holder_deploy_id = EXCLUDED.holder_deploy_id, fencing_token = environment_locks.fencing_token + 1,
    acquired_at = now(), lease_expires_at = NULL
WHERE environment_locks.holder_deploy_id IS NULL
RETURNING fencing_token`, nd.AccountID, nd.Environment, id).Scan(&token).Error
	if err != nil {
		return 0, fmt.Errorf("deploys: acquire lock: %w", err)
	}
	if len(token) > 0 {
		return token[0], nil
	}
	var holder []string
	if err := db.Raw(`SELECT holder_deploy_id FROM environment_locks WHERE account_id = ? AND environment = ?`,
		nd.AccountID, nd.Environment).Scan(&holder).Error; err != nil {
		return 0, fmt.Errorf("deploys: lock holder: %w", err)
	}
	e := &problem.Error{
		Code: "environment_locked",
		Detail: fmt.Sprintf("environment %s is locked by another deploy that is queued or running; wait for it (GET /v1/deploys/{holder_deploy_id}) or cancel it",
			nd.Environment),
		RetryAfter: lockRetryAfter,
	}
	e.With("environment", nd.Environment)
	if len(holder) == 1 {
		e.With("holder_deploy_id", holder[0])
	}
	return 0, e
}

// versionMismatch is 409 environment_version_mismatch: environment is at version, not at expected.
func versionMismatch(environment string, version, expected int64) *problem.Error {
	return problem.New("environment_version_mismatch",
		"environment %s is at version %d, not %d: something was deployed since you planned; look at GET /v1/environments/%s and plan again",
		environment, version, expected, environment).
		With("environment", environment).With("current_version", version)
}

// Deploy implements Store.
func (PostgresStore) Deploy(ctx context.Context, db *gorm.DB, accountID, id string) (Deploy, error) {
	r, err := oneDeploy(ctx, db, `WHERE d.id = ? AND d.account_id = ?`, id, accountID)
	return r.Deploy, err
}

// DeployByOperation implements Store.
func (PostgresStore) DeployByOperation(ctx context.Context, db *gorm.DB, accountID, operationID string) (Deploy, error) {
	r, err := oneDeploy(ctx, db, `WHERE d.operation_id = ? AND d.account_id = ?`, operationID, accountID)
	return r.Deploy, err
}

func oneDeploy(ctx context.Context, db *gorm.DB, where string, args ...any) (deployRow, error) {
	var rows []deployRow
	if err := db.WithContext(ctx).Raw(selectDeploy+where, args...).Scan(&rows).Error; err != nil {
		return deployRow{}, fmt.Errorf("deploys: get: %w", err)
	}
	if len(rows) == 0 {
		return deployRow{}, problem.NotFound("deploy")
	}
	return rows[0], nil
}

// Environment implements Store.
func (PostgresStore) Environment(ctx context.Context, db *gorm.DB, accountID, name string) (Environment, error) {
	envs, err := environments(ctx, db, `e.account_id = ? AND e.name = ?`, []any{accountID, name}, 1)
	if err != nil {
		return Environment{}, err
	}
	if len(envs) == 0 {
		return Environment{}, problem.New("not_found", "environment %s has never been deployed to in this account", name)
	}
	return envs[0], nil
}

// Environments implements Store.
func (PostgresStore) Environments(ctx context.Context, db *gorm.DB, accountID, after string, limit int) ([]Environment, error) {
	return environments(ctx, db, `e.account_id = ? AND e.name > ?`, []any{accountID, after}, limit)
}

// RecentDeploys implements Store.
func (PostgresStore) RecentDeploys(ctx context.Context, db *gorm.DB, accountID, environment string, limit int) ([]Deploy, error) {
	var rows []deployRow
	err := db.WithContext(ctx).Raw(selectDeploy+`WHERE d.account_id = ? AND d.environment = ? ORDER BY d.created_at DESC, d.id DESC LIMIT ?`,
		accountID, environment, limit).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("deploys: recent deploys: %w", err)
	}
	out := make([]Deploy, len(rows))
	for i, r := range rows {
		out[i] = r.Deploy
	}
	return out, nil
}

// environments selects environments with their lock holder, by name.
func environments(ctx context.Context, db *gorm.DB, where string, args []any, limit int) ([]Environment, error) {
	var rows []struct {
		Name             string
		Version          int64
		CurrentDeployID  *string
		CurrentArtifact  *string
		CurrentCommitSHA *string `gorm:"column:current_commit_sha"`
		PreviousDeployID *string
		UpdatedAt        time.Time
		HolderDeployID   *string
		FencingToken     *int64
		AcquiredAt       *time.Time
		LeaseExpiresAt   *time.Time
	}
	err := db.WithContext(ctx).Raw(`
SELECT e.name, e.version, e.current_deploy_id, e.current_artifact, e.current_commit_sha, e.previous_deploy_id,
       e.updated_at, l.holder_deploy_id, l.fencing_token, l.acquired_at, l.lease_expires_at
FROM environments e
LEFT JOIN environment_locks l ON l.account_id = e.account_id AND l.environment = e.name
WHERE `+where+` ORDER BY e.name LIMIT ?`, append(args, limit)...).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("deploys: environment: %w", err)
	}
	out := make([]Environment, 0, len(rows))
	for _, r := range rows {
		env := Environment{
			Name: r.Name, Version: r.Version, CurrentDeployID: r.CurrentDeployID, CurrentArtifact: r.CurrentArtifact,
			CurrentCommitSHA: r.CurrentCommitSHA, PreviousDeployID: r.PreviousDeployID, UpdatedAt: r.UpdatedAt,
		}
		if r.HolderDeployID != nil {
			env.Lock = &Lock{HolderDeployID: *r.HolderDeployID, FencingToken: *r.FencingToken, LeaseExpiresAt: r.LeaseExpiresAt}
			if r.AcquiredAt != nil {
				env.Lock.AcquiredAt = *r.AcquiredAt
			}
		}
		out = append(out, env)
	}
	return out, nil
}

// RollbackPlan implements Store.
func (s PostgresStore) RollbackPlan(ctx context.Context, db *gorm.DB, accountID, id string) (RollbackPlan, error) {
	of, err := s.Deploy(ctx, db, accountID, id)
	if err != nil {
		return RollbackPlan{}, err
	}
	env, err := s.Environment(ctx, db, accountID, of.Environment)
	if err != nil {
		return RollbackPlan{}, err
	}
	if env.CurrentDeployID == nil || *env.CurrentDeployID != of.ID {
		return RollbackPlan{}, problem.New("invalid_state",
			"deploy %s is not the current deploy of environment %s; only the current deploy can be rolled back", of.ID, of.Environment).
			With("state", of.State)
	}
	if env.PreviousDeployID == nil {
		return RollbackPlan{}, problem.New("invalid_state",
			"environment %s had no successful deploy before %s: there is nothing to roll back to", of.Environment, of.ID).
			With("state", of.State)
	}
	to, err := s.Deploy(ctx, db, accountID, *env.PreviousDeployID)
	if err != nil {
		return RollbackPlan{}, err
	}
	return RollbackPlan{Of: of, To: to}, nil
}

// Cancel implements Store. The conditional UPDATE on the deploy row decides a cancel racing the controller:
// whichever of the cancel and the controller's BeginActivation commits first wins, the other matches nothing.
func (s PostgresStore) Cancel(ctx context.Context, tx *gorm.DB, accountID, id, actor string) (Deploy, bool, error) {
	db := tx.WithContext(ctx)
	var cancelled []deployRow
	err := db.Raw(`
UPDATE deploys SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = ? AND account_id = ?
  AND (state = 'queued' OR (state = 'running' AND activation_started_at IS NULL))
RETURNING id, account_id, operation_id, environment, state`, id, accountID).Scan(&cancelled).Error
	if err != nil {
		return Deploy{}, false, fmt.Errorf("deploys: cancel: %w", err)
	}
	if len(cancelled) == 0 {
		cur, err := oneDeploy(ctx, tx, `WHERE d.id = ? AND d.account_id = ?`, id, accountID)
		if err != nil {
			return Deploy{}, false, err
		}
		switch {
		case cur.StoredState == StateCancelled:
			return cur.Deploy, false, nil
		case cur.StoredState == StateRunning:
			return Deploy{}, false, problem.New("invalid_state",
				"deploy %s is already activating on the target and can no longer be cancelled; when it finishes, roll it back", id).
				With("state", cur.State)
		default:
			return Deploy{}, false, problem.New("invalid_state", "deploy %s is %s and can no longer be cancelled", id, cur.State).
				With("state", cur.State)
		}
	}
	d := cancelled[0]
	if err := releaseLock(ctx, tx, accountID, d.Environment, d.ID, nil); err != nil {
		return Deploy{}, false, err
	}
	// The operation may be unknown (its worker died before activating): cancelling it is still the truth,
	// because activation had not started and can no longer start.
	if _, err := opstatus.Transition(ctx, database.SQL(tx), d.AccountID, d.OperationID, opstatus.StateCancelled, actor,
		opstatus.From(opstatus.StateQueued, opstatus.StateRunning, opstatus.StateUnknown),
		opstatus.WithLease(time.Time{}),
		opstatus.WithEvent(opstore.EventStateChanged, map[string]any{"reason": "cancel requested"})); err != nil {
		return Deploy{}, false, err
	}
	out, err := s.Deploy(ctx, tx, accountID, id)
	return out, true, err
}

// releaseLock frees the environment's lock if deploy still holds it (with token, when token is set).
func releaseLock(ctx context.Context, tx *gorm.DB, accountID, environment, deployID string, token *int64) error {
	q := `UPDATE environment_locks SET holder_deploy_id = NULL, acquired_at = NULL, lease_expires_at = NULL
WHERE account_id = ? AND environment = ? AND holder_deploy_id = ?`
	args := []any{accountID, environment, deployID}
	if token != nil {
		q += ` AND fencing_token = ?`
		args = append(args, *token)
	}
	res := tx.WithContext(ctx).Exec(q, args...)
	if res.Error != nil {
		return fmt.Errorf("deploys: release lock: %w", res.Error)
	}
	if token != nil && res.RowsAffected != 1 {
		return ErrLockLost
	}
	return nil
}

// ClaimQueued implements Store. It is fair between accounts in two statements under one row lock:
//
//  1. Of the accounts with queued work that no other claimer holds (SKIP LOCKED), lock the one whose last start
//     is oldest (never started first): round robin, whatever the number of deploys each has queued.
//  2. Now that no other claimer can start a deploy of that account, count its running deploys in a fresh
//     statement (READ COMMITTED: it sees every start and finish committed before the lock was granted) and
//     start its oldest queued deploy only if the count is below maxRunning.
//
// An account found at its cap (or emptied meanwhile) is passed over for the next one, at most claimAttempts
// times a call. A running deploy whose operation is unknown still counts until the reconciler settles it.
func (PostgresStore) ClaimQueued(ctx context.Context, tx *gorm.DB, maxRunning int, leaseUntil time.Time, actor string) (Claim, bool, error) {
	db := tx.WithContext(ctx)
	passed := []string{""} // account ids are never empty; NOT IN () would match nothing
	for range claimAttempts {
		var account []string
		err := db.Raw(`
SELECT a.account_id FROM deploy_accounts a
WHERE a.account_id NOT IN ?
  AND EXISTS (SELECT 1 FROM deploys q WHERE q.account_id = a.account_id AND q.state = 'queued')
  AND (SELECT count(*) FROM deploys r WHERE r.account_id = a.account_id AND r.state = 'running') < ?
ORDER BY a.last_started_at NULLS FIRST, a.account_id
LIMIT 1 FOR UPDATE OF a SKIP LOCKED`, passed, maxRunning).Scan(&account).Error
		if err != nil {
			return Claim{}, false, fmt.Errorf("deploys: claim: pick account: %w", err)
		}
		if len(account) == 0 {
			return Claim{}, false, nil
		}
		var rows []deployRow
		err = db.Raw(`
WITH next AS (
    SELECT account_id, id FROM deploys
    WHERE account_id = ? AND state = 'queued'
      AND (SELECT count(*) FROM deploys r WHERE r.account_id = ? AND r.state = 'running') < ?
    ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED
), d AS (
    UPDATE deploys SET state = 'running', started_at = clock_timestamp(), updated_at = now()
    FROM next WHERE deploys.account_id = next.account_id AND deploys.id = next.id
    RETURNING deploys.*
)
SELECT `+deployColumns+` FROM d`, account[0], account[0], maxRunning).Scan(&rows).Error
		if err != nil {
			return Claim{}, false, fmt.Errorf("deploys: claim queued: %w", err)
		}
		if len(rows) == 0 {
			passed = append(passed, account[0])
			continue
		}
		if err := db.Exec(`UPDATE deploy_accounts SET last_started_at = clock_timestamp() WHERE account_id = ?`,
			account[0]).Error; err != nil {
			return Claim{}, false, fmt.Errorf("deploys: claim: account start: %w", err)
		}
		c := Claim{Deploy: rows[0].Deploy, Token: rows[0].FencingToken}
		if err := renewLock(ctx, tx, c, leaseUntil); err != nil {
			return Claim{}, false, fmt.Errorf("deploys: claim %s: %w", c.Deploy.ID, err)
		}
		moved, err := opstatus.Transition(ctx, database.SQL(tx), c.Deploy.AccountID, c.Deploy.OperationID, opstatus.StateRunning, actor,
			opstatus.From(opstatus.StateQueued), opstatus.WithLease(leaseUntil),
			opstatus.WithEvent(opstore.EventStateChanged, map[string]any{"fencing_token": c.Token, "steps": c.Deploy.StepsTotal}))
		if err != nil {
			return Claim{}, false, err
		}
		if !moved {
			return Claim{}, false, fmt.Errorf("deploys: claim %s: operation %s is not queued", c.Deploy.ID, c.Deploy.OperationID)
		}
		return c, true, nil
	}
	return Claim{}, false, nil
}

// claimAttempts bounds how many accounts one ClaimQueued passes over (at their cap since the pick, or emptied
// by a cancel or the queue timeout) before it reports nothing to claim; the controller's next pass goes on.
const claimAttempts = 8

// ExpireQueued implements Store. The conditional UPDATE over rows locked FOR UPDATE SKIP LOCKED decides a race
// with a claim, a cancel or another replica's expiry: a deploy a claimer holds is skipped (and is no longer
// queued when it is released), and a cancel that waited re-reads the row and matches nothing.
func (PostgresStore) ExpireQueued(ctx context.Context, tx *gorm.DB, queuedBefore time.Time, limit int, actor string, detail map[string]any) ([]Deploy, error) {
	db := tx.WithContext(ctx)
	var expired []deployRow
	err := db.Raw(`
WITH old AS (
    SELECT account_id, id FROM deploys WHERE state = 'queued' AND queued_at < ?
    ORDER BY queued_at, id LIMIT ? FOR UPDATE SKIP LOCKED
), d AS (
    UPDATE deploys SET state = 'failed', finished_at = now(), updated_at = now()
    FROM old WHERE deploys.account_id = old.account_id AND deploys.id = old.id
    RETURNING deploys.*
)
SELECT `+deployColumns+` FROM d ORDER BY d.queued_at, d.id`,
		queuedBefore, limit).Scan(&expired).Error
	if err != nil {
		return nil, fmt.Errorf("deploys: expire queued: %w", err)
	}
	out := make([]Deploy, 0, len(expired))
	for _, d := range expired {
		if err := releaseLock(ctx, tx, d.AccountID, d.Environment, d.ID, nil); err != nil {
			return nil, err
		}
		moved, err := opstatus.Transition(ctx, database.SQL(tx), d.AccountID, d.OperationID, opstatus.StateFailed, actor,
			opstatus.From(opstatus.StateQueued), opstatus.WithLease(time.Time{}),
			opstatus.WithEvent(opstore.EventFailed, detail))
		if err != nil {
			return nil, err
		}
		if !moved {
			return nil, fmt.Errorf("deploys: expire %s: operation %s is not queued", d.ID, d.OperationID)
		}
		d.State = StateFailed
		out = append(out, d.Deploy)
	}
	return out, nil
}

// renewLock is the fencing check: the lock row must still name this deploy with this token. It takes the
// lock row's row lock, so a takeover waits for the transaction and then sees the result.
func renewLock(ctx context.Context, tx *gorm.DB, c Claim, until time.Time) error {
	res := tx.WithContext(ctx).Exec(`UPDATE environment_locks SET lease_expires_at = ?
WHERE account_id = ? AND environment = ? AND holder_deploy_id = ? AND fencing_token = ?`,
		until, c.Deploy.AccountID, c.Deploy.Environment, c.Deploy.ID, c.Token)
	if res.Error != nil {
		return fmt.Errorf("deploys: renew lock: %w", res.Error)
	}
	if res.RowsAffected != 1 {
		return ErrLockLost
	}
	return nil
}

// Renew implements Store.
func (PostgresStore) Renew(ctx context.Context, tx *gorm.DB, c Claim, leaseUntil time.Time) error {
	if err := renewLock(ctx, tx, c, leaseUntil); err != nil {
		return err
	}
	return extendOperation(ctx, tx, c, leaseUntil)
}

func extendOperation(ctx context.Context, tx *gorm.DB, c Claim, until time.Time) error {
	ok, err := opstatus.ExtendLease(ctx, database.SQL(tx), c.Deploy.AccountID, c.Deploy.OperationID, until)
	if err != nil {
		return err
	}
	if !ok {
		// The lease ran out before this heartbeat and the operation is unknown: the reconciler owns it now.
		return ErrLockLost
	}
	return nil
}

// updateRunning applies set to the deploy while it is running and not yet activating, the controller's
// condition for every write before activation.
func updateRunning(ctx context.Context, tx *gorm.DB, c Claim, set string, args ...any) error {
	args = append(args, c.Deploy.AccountID, c.Deploy.ID)
	res := tx.WithContext(ctx).Exec(`UPDATE deploys SET `+set+`, updated_at = now()
WHERE account_id = ? AND id = ? AND state = 'running' AND activation_started_at IS NULL`, args...)
	if res.Error != nil {
		return fmt.Errorf("deploys: update %s: %w", c.Deploy.ID, res.Error)
	}
	if res.RowsAffected != 1 {
		return ErrLockLost
	}
	return nil
}

// CompleteStep implements Store.
func (PostgresStore) CompleteStep(ctx context.Context, tx *gorm.DB, c Claim, step int, leaseUntil time.Time, actor string) error {
	if err := updateRunning(ctx, tx, c, `steps_completed = ?`, step); err != nil {
		return err
	}
	if err := renewLock(ctx, tx, c, leaseUntil); err != nil {
		return err
	}
	if err := extendOperation(ctx, tx, c, leaseUntil); err != nil {
		return err
	}
	return opstatus.Append(ctx, database.SQL(tx), c.Deploy.AccountID, c.Deploy.OperationID, EventStepCompleted, actor,
		map[string]any{"step": step, "of": c.Deploy.StepsTotal})
}

// BeginActivation implements Store.
func (PostgresStore) BeginActivation(ctx context.Context, tx *gorm.DB, c Claim, leaseUntil time.Time, actor string) error {
	if err := updateRunning(ctx, tx, c, `activation_started_at = now()`); err != nil {
		return err
	}
	if err := renewLock(ctx, tx, c, leaseUntil); err != nil {
		return err
	}
	if err := extendOperation(ctx, tx, c, leaseUntil); err != nil {
		return err
	}
	return opstatus.Append(ctx, database.SQL(tx), c.Deploy.AccountID, c.Deploy.OperationID, EventActivationStarted, actor,
		map[string]any{"reference": c.Deploy.Reference().String(), "fencing_token": c.Token})
}

// Requeue implements Store.
func (PostgresStore) Requeue(ctx context.Context, tx *gorm.DB, c Claim, actor string) error {
	if err := updateRunning(ctx, tx, c, `state = 'queued', started_at = NULL, queued_at = now()`); err != nil {
		return err
	}
	res := tx.WithContext(ctx).Exec(`UPDATE environment_locks SET lease_expires_at = NULL
WHERE account_id = ? AND environment = ? AND holder_deploy_id = ? AND fencing_token = ?`,
		c.Deploy.AccountID, c.Deploy.Environment, c.Deploy.ID, c.Token)
	if res.Error != nil {
		return fmt.Errorf("deploys: requeue: %w", res.Error)
	}
	if res.RowsAffected != 1 {
		return ErrLockLost
	}
	moved, err := opstatus.Transition(ctx, database.SQL(tx), c.Deploy.AccountID, c.Deploy.OperationID, opstatus.StateQueued, actor,
		opstatus.From(opstatus.StateRunning), opstatus.WithLease(time.Time{}),
		opstatus.WithEvent(opstore.EventStateChanged, map[string]any{"reason": "controller stopped before activation"}))
	if err != nil {
		return err
	}
	if !moved {
		return ErrLockLost
	}
	return nil
}

// RequeueLost implements Store. The deploy keeps its lock, now under the reconciler's token, which becomes the
// deploy's own: the controller that claims it next activates under it, and the dead worker's older token stays
// fenced out. It starts again from its first step.
func (PostgresStore) RequeueLost(ctx context.Context, tx *gorm.DB, c Claim, maxAttempts int, actor, event string, detail any) (bool, error) {
	res := tx.WithContext(ctx).Exec(`UPDATE deploys SET state = 'queued', fencing_token = ?, attempts = attempts + 1,
    steps_completed = 0, activation_started_at = NULL, started_at = NULL, queued_at = now(), updated_at = now()
WHERE account_id = ? AND id = ? AND state = 'running' AND attempts < ?`, c.Token, c.Deploy.AccountID, c.Deploy.ID, maxAttempts)
	if res.Error != nil {
		return false, fmt.Errorf("deploys: requeue lost %s: %w", c.Deploy.ID, res.Error)
	}
	if res.RowsAffected != 1 {
		return false, nil
	}
	moved, err := opstatus.Transition(ctx, database.SQL(tx), c.Deploy.AccountID, c.Deploy.OperationID, opstatus.StateQueued, actor,
		opstatus.From(opstatus.StateRunning, opstatus.StateUnknown), opstatus.WithLease(time.Time{}),
		opstatus.WithEvent(event, detail))
	if err != nil {
		return false, err
	}
	if !moved {
		return false, ErrLockLost
	}
	return true, nil
}

// Finish implements Store.
func (s PostgresStore) Finish(ctx context.Context, tx *gorm.DB, c Claim, succeeded bool, actor, event string, detail any) error {
	if err := s.Settle(ctx, tx, c, succeeded); err != nil {
		return err
	}
	state := StateFailed
	if succeeded {
		state = StateSucceeded
	}
	d := c.Deploy
	moved, err := opstatus.Transition(ctx, database.SQL(tx), d.AccountID, d.OperationID, opstatus.State(state), actor,
		opstatus.From(opstatus.StateRunning, opstatus.StateUnknown), opstatus.WithLease(time.Time{}),
		opstatus.WithEvent(event, detail))
	if err != nil {
		return err
	}
	if !moved {
		return ErrLockLost
	}
	return nil
}

// Settle implements Store.
func (PostgresStore) Settle(ctx context.Context, tx *gorm.DB, c Claim, succeeded bool) error {
	db := tx.WithContext(ctx)
	d := c.Deploy
	if err := db.Exec(`SELECT 1 FROM environments WHERE account_id = ? AND name = ? FOR UPDATE`,
		d.AccountID, d.Environment).Error; err != nil {
		return fmt.Errorf("deploys: finish: lock environment: %w", err)
	}
	state := StateFailed
	if succeeded {
		state = StateSucceeded
	}
	res := db.Exec(`UPDATE deploys SET state = ?, finished_at = now(), updated_at = now()
WHERE account_id = ? AND id = ? AND state = 'running'`, state, d.AccountID, d.ID)
	if res.Error != nil {
		return fmt.Errorf("deploys: finish %s: %w", d.ID, res.Error)
	}
	if res.RowsAffected != 1 {
		return ErrLockLost
	}
	if err := releaseLock(ctx, tx, d.AccountID, d.Environment, d.ID, &c.Token); err != nil {
		return err
	}
	if succeeded {
		// The version the deploy makes, not one more than the environment's: an environment caught up from the
		// target's marker of this very deploy (CatchUp) is already there.
		err := db.Exec(`
UPDATE environments e
SET version = d.environment_version + 1,
    previous_deploy_id = CASE WHEN e.current_deploy_id = d.id THEN e.previous_deploy_id ELSE e.current_deploy_id END,
    current_deploy_id = d.id, current_artifact = d.artifact, current_commit_sha = d.commit_sha, updated_at = now()
FROM deploys d WHERE d.account_id = ? AND d.id = ? AND e.account_id = d.account_id AND e.name = d.environment`, d.AccountID, d.ID).Error
		if err != nil {
			return fmt.Errorf("deploys: finish %s: environment: %w", d.ID, err)
		}
	}
	return nil
}

// CatchUp implements Store.
func (PostgresStore) CatchUp(ctx context.Context, tx *gorm.DB, accountID, environment string, a Activation) (bool, error) {
	res := tx.WithContext(ctx).Exec(`UPDATE environments
SET version = ?, previous_deploy_id = current_deploy_id, current_deploy_id = ?, current_artifact = ?, current_commit_sha = ?,
    updated_at = now()
WHERE account_id = ? AND name = ? AND version < ?`,
		a.EnvironmentVersion, a.DeployID, a.Artifact, a.CommitSHA, accountID, environment, a.EnvironmentVersion)
	if res.Error != nil {
		return false, fmt.Errorf("deploys: catch up %s: %w", environment, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// Adopt implements Store. The environment is neither locked for the deploy nor checked against the version
// nd expects: both were settled when the deploy was first made, and the target activated it.
func (s PostgresStore) Adopt(ctx context.Context, tx *gorm.DB, nd NewDeploy, a Activation) (Deploy, error) {
	db := tx.WithContext(ctx)
	unchecked := nd
	unchecked.ExpectedEnvironmentVersion, unchecked.RollsBackDeployID = nil, nil
	if _, err := lockEnvironment(db, unchecked); err != nil {
		return Deploy{}, err
	}
	var rows []deployRow
	err := db.Raw(`
WITH d AS (
    INSERT INTO deploys (id, account_id, operation_id, kind, service, environment, artifact, commit_sha,
                         rolls_back_deploy_id, state, environment_version, fencing_token, steps_total, steps_completed,
                         activation_started_at, started_at, finished_at)
    VALUES (?, ?, ?, ?, ?, ?, NULLIF(?, ''), NULLIF(?, ''), ?, 'succeeded', ?, ?, ?, ?, ?, ?, now())
    RETURNING *
)
SELECT `+deployColumns+` FROM d`,
		nd.ID, nd.AccountID, nd.OperationID, nd.Kind, nd.Service, nd.Environment, nd.Artifact, nd.CommitSHA,
		nd.RollsBackDeployID, max(a.EnvironmentVersion-1, 0), a.FencingToken, nd.StepsTotal, nd.StepsTotal,
		a.ActivatedAt, a.ActivatedAt).Scan(&rows).Error
	if err != nil {
		return Deploy{}, fmt.Errorf("deploys: adopt %s: %w", nd.ID, err)
	}
	if _, err := s.CatchUp(ctx, tx, nd.AccountID, nd.Environment, a); err != nil {
		return Deploy{}, err
	}
	return rows[0].Deploy, nil
}

// TakeOver implements Store.
func (PostgresStore) TakeOver(ctx context.Context, tx *gorm.DB, d Deploy, now time.Time) (Claim, error) {
	var token []int64
	err := tx.WithContext(ctx).Raw(`
UPDATE environment_locks SET fencing_token = fencing_token + 1, lease_expires_at = NULL
WHERE account_id = ? AND environment = ? AND holder_deploy_id = ?
  AND (lease_expires_at IS NULL OR lease_expires_at < ?)
RETURNING fencing_token`, d.AccountID, d.Environment, d.ID, now).Scan(&token).Error
	if err != nil {
		return Claim{}, fmt.Errorf("deploys: take over %s: %w", d.ID, err)
	}
	if len(token) == 1 {
		return Claim{Deploy: d, Token: token[0]}, nil
	}
	var holder []struct{ LeaseExpiresAt *time.Time }
	if err := tx.WithContext(ctx).Raw(`SELECT lease_expires_at FROM environment_locks
WHERE account_id = ? AND environment = ? AND holder_deploy_id = ?`, d.AccountID, d.Environment, d.ID).Scan(&holder).Error; err != nil {
		return Claim{}, fmt.Errorf("deploys: take over %s: %w", d.ID, err)
	}
	if len(holder) == 1 {
		until := now
		if holder[0].LeaseExpiresAt != nil {
			until = *holder[0].LeaseExpiresAt
		}
		return Claim{}, &LeaseLiveError{Until: until}
	}
	return Claim{}, ErrLockLost
}
