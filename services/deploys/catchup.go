package deploys

// Catching up with the target. An environment's version lives in our database; after a failover to an
// asynchronous standby it can go back (a deploy that succeeded on the old primary is gone with it) while the
// target still runs what it activated. A client that planned against the newer version, and sends its deploy
// again under the same key, would then be refused 409 environment_version_mismatch for a version it saw us
// acknowledge. So when a deploy expects a version newer than the environment's, the target's newest marker for
// the environment is asked first: if it shows that version, the environment catches up with it (version, current
// deploy and reference) and the deploy is decided against it. A version the target does not know either is still
// refused: nothing says it ever existed.
//
// The same goes for a deploy request itself: a deploy's id is derived from the account and the Idempotency-Key,
// so the same-key retry of a deploy the failover took from our database has that deploy's id. When the target
// holds a marker of it, the deploy was activated: it is recorded succeeded from the marker (the environment caught
// up with it if behind) and answered as it was, never run again.

import (
	"context"
	"errors"
	"log/slog"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// deployIDSpace is the UUID namespace of deploy ids derived from a request's key.
var deployIDSpace = uuid.MustParse("5b0f4c52-8d7e-4a51-9f0e-2c3d6a1b7e90")

// deployID is the id of the deploy a request under key makes: derived from the account and the key, and from
// the operation that gave the key up at the end of its lifetime (predecessor, opstore.KeyPredecessor) if one did,
// since the same key then names a new deploy; a random one for a write sent without a key.
func deployID(accountID, key, predecessor string) string {
	if key == "" {
		return ids.New("dep_")
	}
	return "dep_" + uuid.NewSHA1(deployIDSpace, []byte(accountID+"\x00"+key+"\x00"+predecessor)).String()
}

// earlier is what the target activated before, under the id the request under key would make: found false
// when it activated nothing there (or could not be asked: the target activates an id at most once anyway, so not
// knowing costs a run, never a second activation). It is asked before the claim's transaction, which holds a
// connection that a target on the same database would otherwise wait beside; makeDeploy checks that the
// operation's id is the one asked about.
func (s *Server) earlier(ctx context.Context, accountID, key string) (marker Activation, found bool) {
	if s.Target == nil || key == "" {
		return Activation{}, false
	}
	// Any operation this request claims is newer than one made now.
	predecessor, err := opstore.KeyPredecessor(ctx, database.SQL(s.DB), accountID, key, opstatus.NewID())
	if err == nil {
		marker, found, err = s.Target.Activation(ctx, deployID(accountID, key, predecessor))
	}
	if err != nil {
		s.log().Warn("deploy target not asked for an earlier activation", "error", err)
		return Activation{}, false
	}
	return marker, found
}

// makeDeploy makes nd under op: the deploy the target activated earlier under its id (marker, from earlier),
// adopted, or a new one queued (createCaughtUp). adopted reports the first.
func (s *Server) makeDeploy(ctx context.Context, tx *gorm.DB, op opstatus.Operation, nd NewDeploy, marker Activation, found bool) (d Deploy, adopted bool, err error) {
	predecessor, err := opstore.KeyPredecessor(ctx, database.SQL(tx), op.AccountID, op.IdempotencyKey, op.ID)
	if err != nil {
		return Deploy{}, false, err
	}
	nd.ID = deployID(op.AccountID, op.IdempotencyKey, predecessor)
	if found && marker.DeployID == nd.ID {
		if d, err = s.Store.Adopt(ctx, tx, nd, marker); err != nil {
			return Deploy{}, false, err
		}
		s.log().Warn("deploy adopted from the target's marker: the database had lost it", "deploy_id", nd.ID,
			"environment", nd.Environment, "environment_version", marker.EnvironmentVersion)
		return d, true, nil
	}
	d, err = s.createCaughtUp(ctx, tx, nd)
	return d, false, err
}

// createCaughtUp is Store.CreateDeploy, with the environment caught up from the target when nd expects a
// version newer than the environment's and the target's marker knows it.
func (s *Server) createCaughtUp(ctx context.Context, tx *gorm.DB, nd NewDeploy) (Deploy, error) {
	d, err := s.Store.CreateDeploy(ctx, tx, nd)
	current, behind := versionBehind(err, nd)
	if !behind {
		return d, err
	}
	if s.Target == nil {
		return d, err
	}
	marker, found, terr := s.Target.Latest(ctx, nd.AccountID, nd.Environment)
	if terr != nil || !found || marker.EnvironmentVersion <= current {
		return d, err // the target knows nothing newer: the refusal stands
	}
	caught, cerr := s.Store.CatchUp(ctx, tx, nd.AccountID, nd.Environment, marker)
	if cerr != nil || !caught {
		return d, errors.Join(err, cerr)
	}
	s.log().Warn("environment caught up with the target's marker: the database had lost its newest version",
		"environment", nd.Environment, "from_version", current, "to_version", marker.EnvironmentVersion, "deploy_id", marker.DeployID)
	return s.Store.CreateDeploy(ctx, tx, nd)
}

// versionBehind reports whether err refuses nd because the environment is at a version older than the one nd
// expects, and at which.
func versionBehind(err error, nd NewDeploy) (int64, bool) {
	var pe *problem.Error
	if nd.ExpectedEnvironmentVersion == nil || !errors.As(err, &pe) || pe.Code != "environment_version_mismatch" {
		return 0, false
	}
	current, ok := pe.Extensions["current_version"].(int64)
	return current, ok && current < *nd.ExpectedEnvironmentVersion
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}
