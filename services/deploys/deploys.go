// Package deploys is the deploy service of retrysafe: deploys of immutable references only, one at a time per
// environment under a release lock with a fencing token, a controller that runs them in the background, a
// status resource, cancel, rollback as its own operation, and approvals for production.
//
// Idempotency alone cannot stop two different deploys aimed at one environment (an agent that lost the answer
// to dep-118 plans dep-119 for a newer commit under a new key): the release lock and expected_environment_version
// do. A deploy leaves the process when the controller activates it on the target; if the controller dies, the
// operation's lease expires and the reconciler settles the deploy from the target's marker, never by running it
// again.
//
// This file holds the domain: types, the commands with their validation, and the Store interface. store.go
// implements the store on gorm + PostgreSQL, target.go the simulated target, controller.go the worker,
// reconcile.go the reconciler, http.go and routes.go the HTTP adapter.
package deploys

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Operation kinds of the service.
const (
	KindDeploy   = "deploys.create"
	KindRollback = "deploys.rollback"
)

// DeployKind tells a deploy forward from a rollback (not to be confused with the operation kinds above).
type DeployKind string

const (
	DeployForward  DeployKind = "deploy"
	DeployRollback DeployKind = "rollback"
)

// State of a deploy: the states of its operation. StateUnknown is never stored on the deploy: it is reported
// while the deploy's operation is unknown (its worker died) and the reconciler has not settled it.
type State = opstatus.State

const (
	StateQueued    = opstatus.StateQueued
	StateRunning   = opstatus.StateRunning
	StateSucceeded = opstatus.StateSucceeded
	StateFailed    = opstatus.StateFailed
	StateCancelled = opstatus.StateCancelled
	StateUnknown   = opstatus.StateUnknown
)

// Reference is what a deploy activates: exactly one of an artifact pinned by digest or a full commit SHA.
type Reference struct {
	Artifact  string `json:"artifact,omitempty"`
	CommitSHA string `json:"commit_sha,omitempty"`
}

// String is the reference as a person reads it.
func (r Reference) String() string {
	if r.Artifact != "" {
		return r.Artifact
	}
	return r.CommitSHA
}

// Deploy is one deploy or rollback of a service to an environment.
type Deploy struct {
	ID                 string     `json:"id"`
	AccountID          string     `json:"-"`
	OperationID        string     `json:"operation_id"`
	Kind               DeployKind `json:"kind"`
	Service            string     `json:"service"`
	Environment        string     `json:"environment"`
	Artifact           *string    `json:"artifact"`
	CommitSHA          *string    `json:"commit_sha" gorm:"column:commit_sha"`
	RollsBackDeployID  *string    `json:"rolls_back_deploy_id"`
	State              State      `json:"state"`
	EnvironmentVersion int64      `json:"environment_version"`
	FencingToken       int64      `json:"fencing_token"`
	StepsTotal         int        `json:"steps_total"`
	StepsCompleted     int        `json:"steps_completed"`
	ActivationStarted  *time.Time `json:"activation_started_at"`
	StartedAt          *time.Time `json:"started_at"`
	FinishedAt         *time.Time `json:"finished_at"`
	CreatedAt          time.Time  `json:"created_at"`
	UpdatedAt          time.Time  `json:"updated_at"`
}

// OperationKind is the kind of the deploy's operation: KindRollback for a rollback, KindDeploy otherwise.
func (d Deploy) OperationKind() string {
	if d.Kind == DeployRollback {
		return KindRollback
	}
	return KindDeploy
}

// Reference returns what the deploy activates.
func (d Deploy) Reference() Reference {
	var r Reference
	if d.Artifact != nil {
		r.Artifact = *d.Artifact
	}
	if d.CommitSHA != nil {
		r.CommitSHA = *d.CommitSHA
	}
	return r
}

// Status is GET /v1/deploys/{id}: the deploy and the history of its operation.
type Status struct {
	Deploy
	History []opstatus.Event `json:"history"`
}

// Lock is the release lock of an environment while a deploy holds it.
type Lock struct {
	HolderDeployID string     `json:"holder_deploy_id"`
	FencingToken   int64      `json:"fencing_token"`
	AcquiredAt     time.Time  `json:"acquired_at"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
}

// Environment is where deploys go: its version, what runs there and who holds its lock.
type Environment struct {
	Name             string    `json:"name"`
	Version          int64     `json:"version"`
	CurrentDeployID  *string   `json:"current_deploy_id"`
	CurrentArtifact  *string   `json:"current_artifact"`
	CurrentCommitSHA *string   `json:"current_commit_sha"`
	PreviousDeployID *string   `json:"previous_deploy_id"`
	Lock             *Lock     `json:"lock"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// CreateDeploy is the command of POST /v1/deploys.
type CreateDeploy struct {
	Service     string `json:"service"`
	Environment string `json:"environment"`
	Reference
	// ExpectedEnvironmentVersion, when set, is the environment version the caller planned against; the deploy
	// is refused if the environment has moved on.
	ExpectedEnvironmentVersion *int64 `json:"expected_environment_version,omitempty"`
}

// Validate checks the command. A reference that is not pinned (a tag, latest, a branch, a short or uppercase
// SHA) is 422 mutable_reference; other invalid values are 422 validation_failed.
func (cmd *CreateDeploy) Validate() error {
	var errs []problem.FieldError
	errs = checkName(errs, "service", cmd.Service)
	errs = checkName(errs, "environment", cmd.Environment)
	errs = checkExpectedVersion(errs, cmd.ExpectedEnvironmentVersion)
	if len(cmd.Artifact) > MaxArtifactLength {
		// Checked before the pattern: a reference of 10,000 characters is refused for its length, quickly.
		errs = append(errs, problem.FieldError{Field: "artifact", Message: fmt.Sprintf("is too long: at most %d characters", MaxArtifactLength)})
		return problem.Validation(errs...)
	}
	switch {
	case cmd.Artifact == "" && cmd.CommitSHA == "":
		errs = append(errs, problem.FieldError{Field: "artifact", Message: "one of artifact or commit_sha is required"})
	case cmd.Artifact != "" && cmd.CommitSHA != "":
		errs = append(errs, problem.FieldError{Field: "commit_sha", Message: "send either artifact or commit_sha, not both"})
	}
	if len(errs) > 0 {
		return problem.Validation(errs...)
	}
	return ValidateReference(cmd.Reference)
}

// RollbackDeploy is the command of POST /v1/deploys/{id}/rollback. What it rolls back to is not part of the
// command: it is the environment's previous deploy, fixed as long as the rolled-back deploy is current.
type RollbackDeploy struct {
	ExpectedEnvironmentVersion *int64 `json:"expected_environment_version,omitempty"`
}

// Validate checks the command.
func (cmd *RollbackDeploy) Validate() error {
	if errs := checkExpectedVersion(nil, cmd.ExpectedEnvironmentVersion); len(errs) > 0 {
		return problem.Validation(errs...)
	}
	return nil
}

// MaxArtifactLength bounds an artifact reference: an OCI repository name (at most 255 characters) and a
// sha512 digest fit in it.
const MaxArtifactLength = 512

var (
	// An OCI repository name (optional registry host and port, lowercase path components) and a digest; no tag.
	artifactPattern = regexp.MustCompile(`^((?:[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)@(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$`)
	commitPattern   = regexp.MustCompile(`^(?:[0-9a-f]{40}|[0-9a-f]{64})$`)
	namePattern     = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?$`)
)

// ValidateReference accepts only references that name one immutable thing: name@sha256:<64 lowercase hex>,
// name@sha512:<128 lowercase hex>, or a full 40- or 64-character lowercase commit SHA. Anything else could
// point somewhere else tomorrow, so a retry could deploy something other than what was approved.
func ValidateReference(ref Reference) error {
	var errs []problem.FieldError
	if ref.Artifact != "" && !artifactPattern.MatchString(ref.Artifact) {
		errs = append(errs, problem.FieldError{Field: "artifact", Message: artifactProblem(ref.Artifact)})
	}
	if ref.CommitSHA != "" && !commitPattern.MatchString(ref.CommitSHA) {
		errs = append(errs, problem.FieldError{Field: "commit_sha",
			Message: "must be a full 40- or 64-character lowercase hex commit SHA, not a branch, tag or short SHA"})
	}
	if len(errs) == 0 {
		return nil
	}
	return &problem.Error{
		Code:   "mutable_reference",
		Detail: "deploys take immutable references only: an artifact pinned by digest or a full commit SHA",
		Fields: errs,
	}
}

func artifactProblem(artifact string) string {
	name, digest, pinned := strings.Cut(artifact, "@")
	switch {
	case !pinned:
		return "must be pinned by digest, name@sha256: and 64 lowercase hex digits (or sha512: and 128); a tag such as latest can move"
	case strings.Contains(name[strings.LastIndex(name, "/")+1:], ":"):
		return "must name the digest without a tag: name@sha256:..., not name:tag@sha256:..."
	case strings.ToLower(digest) != digest:
		return "the digest must be lowercase hex"
	}
	return "must be name@sha256: and 64 lowercase hex digits, or name@sha512: and 128"
}

func checkName(errs []problem.FieldError, field, value string) []problem.FieldError {
	if value == "" {
		return append(errs, problem.FieldError{Field: field, Message: "is required"})
	}
	if !namePattern.MatchString(value) {
		return append(errs, problem.FieldError{Field: field,
			Message: "must be 1 to 63 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit"})
	}
	return errs
}

func checkExpectedVersion(errs []problem.FieldError, v *int64) []problem.FieldError {
	if v != nil && *v < 0 {
		return append(errs, problem.FieldError{Field: "expected_environment_version", Message: "must be 0 or more"})
	}
	return errs
}

// NewDeploy is a deploy to insert, queued, by Store.CreateDeploy.
type NewDeploy struct {
	// ID is the deploy's id (deployID): derived from the request's key, so that the target's marker of a deploy
	// a failover took from our database is found when its request is sent again.
	ID          string
	AccountID   string
	OperationID string
	Kind        DeployKind
	Service     string
	Environment string
	Reference
	RollsBackDeployID          *string
	ExpectedEnvironmentVersion *int64
	StepsTotal                 int
}

// RollbackPlan is what a rollback of a deploy would do.
type RollbackPlan struct {
	// Of is the deploy rolled back: the environment's current deploy.
	Of Deploy
	// To is the environment's previous deploy, whose reference the rollback deploys again.
	To Deploy
}

// Claim is what a controller worker holds while it runs a deploy: the deploy and its fencing token.
type Claim struct {
	Deploy Deploy
	Token  int64
}

// Event types the service adds to its operations' history.
const (
	EventStepCompleted     = "step_completed"
	EventActivationStarted = "activation_started"
	EventActivated         = "activated"
	EventActivationRefused = "activation_refused"
)

// Errors of the controller's writes.
var (
	// ErrLockLost means the worker's fencing token is no longer the environment's lock token for this deploy,
	// or the deploy left the state the worker expected (cancelled, settled by the reconciler): the worker must
	// stop without writing anything else.
	ErrLockLost = errors.New("deploys: release lock lost")
	// ErrLeaseLive means the reconciler found the lock's lease still running: its worker may be alive.
	ErrLeaseLive = errors.New("deploys: lock lease still live")
)

// LeaseLiveError is TakeOver's ErrLeaseLive, with the end of the lease that still runs.
type LeaseLiveError struct{ Until time.Time }

func (e *LeaseLiveError) Error() string {
	return ErrLeaseLive.Error() + " until " + e.Until.UTC().Format(time.RFC3339)
}
func (e *LeaseLiveError) Is(target error) bool { return target == ErrLeaseLive }

// Store keeps deploys, environments and release locks. Methods that take tx run in the caller's transaction.
type Store interface {
	// CreateDeploy checks the expected environment version, takes the environment's release lock and inserts a
	// queued deploy. Returns environment_version_mismatch or environment_locked problems.
	CreateDeploy(ctx context.Context, tx *gorm.DB, nd NewDeploy) (Deploy, error)
	// Deploy returns a deploy of account; state is unknown while its operation is. Returns an error matching
	// problem.ErrNotFound if there is none.
	Deploy(ctx context.Context, db *gorm.DB, accountID, id string) (Deploy, error)
	// DeployByOperation returns the deploy of an operation. Returns an error matching problem.ErrNotFound.
	DeployByOperation(ctx context.Context, db *gorm.DB, accountID, operationID string) (Deploy, error)
	// Environment returns an environment with its lock holder. Returns an error matching problem.ErrNotFound.
	Environment(ctx context.Context, db *gorm.DB, accountID, name string) (Environment, error)
	// Environments returns up to limit environments of account named after after, by name, with their locks.
	Environments(ctx context.Context, db *gorm.DB, accountID, after string, limit int) ([]Environment, error)
	// RecentDeploys returns the limit newest deploys and rollbacks of an environment, newest first.
	RecentDeploys(ctx context.Context, db *gorm.DB, accountID, environment string, limit int) ([]Deploy, error)
	// RollbackPlan returns what rolling back deploy id would do. Returns problem.ErrNotFound, or invalid_state
	// when the deploy is not its environment's current deploy or there is nothing before it.
	RollbackPlan(ctx context.Context, db *gorm.DB, accountID, id string) (RollbackPlan, error)
	// Cancel moves a queued deploy, or a running one that has not started activating, to cancelled, releases
	// its lock and records the cancel on its operation. changed is false when it was already cancelled.
	// Returns problem.ErrNotFound, or invalid_state when the deploy is past the point where it can stop.
	Cancel(ctx context.Context, tx *gorm.DB, accountID, id, actor string) (d Deploy, changed bool, err error)

	// ClaimQueued takes a queued deploy fairly (FOR UPDATE SKIP LOCKED, safe with several controllers): from the
	// account with queued work whose last start is oldest, among those with fewer than maxRunning deploys
	// running, its oldest queued deploy; moves it to running and gives its lock and operation a lease until
	// leaseUntil. ok is false when nothing can start now.
	ClaimQueued(ctx context.Context, tx *gorm.DB, maxRunning int, leaseUntil time.Time, actor string) (c Claim, ok bool, err error)
	// ExpireQueued fails up to limit deploys that have been queued since before queuedBefore, releases their
	// locks and records on each operation a failed event with detail (whose reason is queue_timeout). It
	// returns the deploys it failed.
	ExpireQueued(ctx context.Context, tx *gorm.DB, queuedBefore time.Time, limit int, actor string, detail map[string]any) ([]Deploy, error)
	// Renew extends the lock's and the operation's lease. Returns ErrLockLost.
	Renew(ctx context.Context, tx *gorm.DB, c Claim, leaseUntil time.Time) error
	// CompleteStep records a finished step and renews the leases. Returns ErrLockLost.
	CompleteStep(ctx context.Context, tx *gorm.DB, c Claim, step int, leaseUntil time.Time, actor string) error
	// BeginActivation marks the point of no return: from here the deploy cannot be cancelled. Returns ErrLockLost.
	BeginActivation(ctx context.Context, tx *gorm.DB, c Claim, leaseUntil time.Time, actor string) error
	// Requeue puts a running deploy that has not started activating back in the queue (graceful shutdown).
	// Returns ErrLockLost.
	Requeue(ctx context.Context, tx *gorm.DB, c Claim, actor string) error
	// RequeueLost puts back in the queue, under the same operation (unknown, now queued, with event and
	// detail), a deploy the reconciler took over (c, its new token) and found never activated, unless it has
	// already run maxAttempts times: requeued false then, and nothing changed.
	RequeueLost(ctx context.Context, tx *gorm.DB, c Claim, maxAttempts int, actor, event string, detail any) (requeued bool, err error)
	// Finish records the deploy's outcome: succeeded (the environment moves to it) or failed, releases the lock
	// and settles the operation with event and detail. Returns ErrLockLost.
	Finish(ctx context.Context, tx *gorm.DB, c Claim, succeeded bool, actor, event string, detail any) error
	// Settle is Finish without the operation: the deploy's rows only, for a person's decision, which moves
	// the operation itself (resolution.Resolve). Returns ErrLockLost.
	Settle(ctx context.Context, tx *gorm.DB, c Claim, succeeded bool) error

	// CatchUp moves the environment forward to the version the target's marker a says it is at, when our row is
	// behind it (a failover lost the commits that recorded it); caught false when it was not behind.
	CatchUp(ctx context.Context, tx *gorm.DB, accountID, environment string, a Activation) (caught bool, err error)
	// Adopt records nd as the deploy the target's marker a says was activated, succeeded without running
	// again, and catches the environment up with a when it is behind: the request was made and activated
	// before a failover took its rows from our database.
	Adopt(ctx context.Context, tx *gorm.DB, nd NewDeploy, a Activation) (Deploy, error)

	// TakeOver gives the lock of an unknown deploy a new fencing token, so its old worker can no longer write,
	// and returns the new claim. Returns ErrLeaseLive (a *LeaseLiveError) while the lease runs, ErrLockLost if the deploy does not
	// hold the lock.
	TakeOver(ctx context.Context, tx *gorm.DB, d Deploy, now time.Time) (Claim, error)
}
