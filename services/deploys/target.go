package deploys

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// Target is where deploys take effect: a remote system, outside the deploys' transactions. It keeps, per
// deploy id, a marker of what it activated, so that after a crash the reconciler can ask it what happened
// instead of activating again, and it honours fencing tokens, so that a worker that lost its lock cannot
// activate anything once a newer token has been shown to it.
type Target interface {
	// Activate makes the deploy's reference live in its environment, at most once per deploy id (a repeated
	// call returns the first activation). Returns ErrFenced when a newer fencing token was seen for the
	// environment.
	Activate(ctx context.Context, d Deploy, token int64) (Activation, error)
	// Fence refuses, from now on, activations in the environment with a token older than token.
	Fence(ctx context.Context, accountID, environment string, token int64) error
	// Activation returns the marker of a deploy; found is false when the target never activated it.
	Activation(ctx context.Context, deployID string) (a Activation, found bool, err error)
	// Latest returns the marker of the environment's newest activation (highest EnvironmentVersion); found is
	// false when the target activated nothing there.
	Latest(ctx context.Context, accountID, environment string) (a Activation, found bool, err error)
}

// ErrFenced is the target's refusal of a stale fencing token.
var ErrFenced = errors.New("deploys: target refused a stale fencing token")

// ErrNotReached matches a NotReachedError: the call never reached the target.
var ErrNotReached = errors.New("deploys: target not reached")

// NotReachedError is an activation that never reached the target (no connection was established: refused,
// DNS, TLS). Nothing was activated, so activating again with the same deploy and fencing token is safe.
type NotReachedError struct {
	// Reason is one of opstatus's dispatch reasons (connection_refused, dns_failure, tls_failure, ...).
	Reason string
}

func (e *NotReachedError) Error() string        { return "deploys: target not reached: " + e.Reason }
func (e *NotReachedError) Is(target error) bool { return target == ErrNotReached }

// ErrActivationFailed is the target's answer that it could not activate the deploy: nothing was activated and
// the deploy fails (reason activation_failed).
var ErrActivationFailed = errors.New("deploys: target: activation failed")

// TargetFault is what an armed fault makes the simulated target do to one activation.
type TargetFault string

const (
	// FaultUnreachable: the activation never reaches the target (connection refused); nothing is recorded
	// there, not even the call.
	FaultUnreachable TargetFault = "unreachable"
	// FaultActivationFails: the target answers that the activation failed; nothing is activated.
	FaultActivationFails TargetFault = "activation_fails"
)

// TargetFaults are faults armed on a SimulatedTarget, for tests: each Arm queues count activations that fail
// that way, in order, like the provider sandbox's POST /admin/faults.
type TargetFaults struct {
	mu    sync.Mutex
	armed []TargetFault
}

// Arm makes the next count activations (after those already armed) fail with f.
func (f *TargetFaults) Arm(fault TargetFault, count int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range count {
		f.armed = append(f.armed, fault)
	}
}

// take consumes the fault of one activation, "" when none is armed.
func (f *TargetFaults) take() TargetFault {
	if f == nil {
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.armed) == 0 {
		return ""
	}
	next := f.armed[0]
	f.armed = f.armed[1:]
	return next
}

// Activation is the target's marker: what it activated for one deploy.
type Activation struct {
	DeployID     string  `json:"deploy_id"`
	Environment  string  `json:"environment"`
	Service      string  `json:"service"`
	Artifact     *string `json:"artifact,omitempty"`
	CommitSHA    *string `json:"commit_sha,omitempty" gorm:"column:commit_sha"`
	FencingToken int64   `json:"fencing_token"`
	// EnvironmentVersion is the version the activation made the environment (0 for markers written before it
	// was kept).
	EnvironmentVersion int64     `json:"environment_version" gorm:"column:environment_version"`
	Calls              int       `json:"calls"`
	ActivatedAt        time.Time `json:"activated_at"`
}

// SimulatedTarget is a Target kept in its own tables (deploy_target_activations, deploy_target_fences), each
// call its own transaction, as a remote system's would be.
type SimulatedTarget struct {
	DB *gorm.DB
	// Faults, when set, are injected into activations (tests).
	Faults *TargetFaults
}

var _ Target = SimulatedTarget{}

const activationColumns = `deploy_id, environment, service, artifact, commit_sha, fencing_token,
COALESCE(environment_version, 0) AS environment_version, calls, activated_at`

// Activate implements Target. One statement: raise the environment's fence to token unless a newer one is
// there, and only then record the activation. A second call for the same deploy counts the call and changes
// nothing else.
func (t SimulatedTarget) Activate(ctx context.Context, d Deploy, token int64) (Activation, error) {
	switch t.Faults.take() {
	case FaultUnreachable:
		return Activation{}, &NotReachedError{Reason: opstore.ReasonConnectionRefused}
	case FaultActivationFails:
		return Activation{}, ErrActivationFailed
	}
	var rows []Activation
	err := t.DB.WithContext(ctx).Raw(`
WITH fence AS (
    INSERT INTO deploy_target_fences AS f (account_id, environment, fencing_token) VALUES (?, ?, ?)
    ON CONFLICT (account_id, environment) DO UPDATE SET fencing_token = EXCLUDED.fencing_token
    WHERE f.fencing_token <= EXCLUDED.fencing_token
    RETURNING 1
)
INSERT INTO deploy_target_activations AS a (deploy_id, account_id, environment, service, artifact, commit_sha, fencing_token,
                                            environment_version)
SELECT ?, ?, ?, ?, ?, ?, ?, ? FROM fence
ON CONFLICT (deploy_id) DO UPDATE SET calls = a.calls + 1
RETURNING `+activationColumns,
		d.AccountID, d.Environment, token,
		d.ID, d.AccountID, d.Environment, d.Service, d.Artifact, d.CommitSHA, token, d.EnvironmentVersion+1).Scan(&rows).Error
	if err != nil {
		return Activation{}, fmt.Errorf("deploys: target: activate %s: %w", d.ID, err)
	}
	if len(rows) == 0 {
		return Activation{}, ErrFenced
	}
	return rows[0], nil
}

// Fence implements Target.
func (t SimulatedTarget) Fence(ctx context.Context, accountID, environment string, token int64) error {
	err := t.DB.WithContext(ctx).Exec(`
INSERT INTO deploy_target_fences AS f (account_id, environment, fencing_token) VALUES (?, ?, ?)
ON CONFLICT (account_id, environment) DO UPDATE SET fencing_token = GREATEST(f.fencing_token, EXCLUDED.fencing_token)`,
		accountID, environment, token).Error
	if err != nil {
		return fmt.Errorf("deploys: target: fence %s: %w", environment, err)
	}
	return nil
}

// Activation implements Target.
func (t SimulatedTarget) Activation(ctx context.Context, deployID string) (Activation, bool, error) {
	var rows []Activation
	err := t.DB.WithContext(ctx).Raw(`SELECT `+activationColumns+` FROM deploy_target_activations WHERE deploy_id = ?`,
		deployID).Scan(&rows).Error
	if err != nil {
		return Activation{}, false, fmt.Errorf("deploys: target: marker of %s: %w", deployID, err)
	}
	if len(rows) == 0 {
		return Activation{}, false, nil
	}
	return rows[0], true, nil
}

// Latest implements Target.
func (t SimulatedTarget) Latest(ctx context.Context, accountID, environment string) (Activation, bool, error) {
	var rows []Activation
	err := t.DB.WithContext(ctx).Raw(`SELECT `+activationColumns+` FROM deploy_target_activations
WHERE account_id = ? AND environment = ? ORDER BY environment_version DESC NULLS LAST, activated_at DESC LIMIT 1`,
		accountID, environment).Scan(&rows).Error
	if err != nil {
		return Activation{}, false, fmt.Errorf("deploys: target: newest marker of %s: %w", environment, err)
	}
	if len(rows) == 0 {
		return Activation{}, false, nil
	}
	return rows[0], true, nil
}

// ObserveTarget returns t reporting every call to observe (metrics): its duration and its outcome, "ok",
// "refused" (ErrFenced, ErrActivationFailed, ErrNotReached: nothing activated) or "unknown" (another error: an
// activation may or may not have happened).
// A nil observe returns t itself.
func ObserveTarget(t Target, observe func(outcome string, d time.Duration)) Target {
	if observe == nil {
		return t
	}
	return observedTarget{t: t, observe: observe}
}

type observedTarget struct {
	t       Target
	observe func(outcome string, d time.Duration)
}

func (o observedTarget) report(start time.Time, err error) {
	outcome := "ok"
	switch {
	case errors.Is(err, ErrFenced), errors.Is(err, ErrActivationFailed), errors.Is(err, ErrNotReached):
		outcome = "refused"
	case err != nil:
		outcome = "unknown"
	}
	o.observe(outcome, time.Since(start))
}

func (o observedTarget) Activate(ctx context.Context, d Deploy, token int64) (Activation, error) {
	start := time.Now()
	a, err := o.t.Activate(ctx, d, token)
	o.report(start, err)
	return a, err
}

func (o observedTarget) Fence(ctx context.Context, accountID, environment string, token int64) error {
	start := time.Now()
	err := o.t.Fence(ctx, accountID, environment, token)
	o.report(start, err)
	return err
}

func (o observedTarget) Latest(ctx context.Context, accountID, environment string) (Activation, bool, error) {
	start := time.Now()
	a, found, err := o.t.Latest(ctx, accountID, environment)
	o.report(start, err)
	return a, found, err
}

func (o observedTarget) Activation(ctx context.Context, deployID string) (Activation, bool, error) {
	start := time.Now()
	a, found, err := o.t.Activation(ctx, deployID)
	o.report(start, err)
	return a, found, err
}
