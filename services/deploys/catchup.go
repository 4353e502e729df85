package deploys

// Catching up with the target. An environment's version lives in our database; after a failover to an
// asynchronous standby it can go back (a deploy that succeeded on the old primary is gone with it) while the
// target still runs what it activated. A client that planned against the newer version, and sends its deploy
// again under the same key, would then be refused 409 environment_version_mismatch for a version it saw us
// acknowledge. So when a deploy expects a version newer than the environment's, the target's newest marker for
// the environment is asked first: if it shows that version, the environment catches up with it (version, current
// deploy and reference) and the deploy is decided against it. A version the target does not know either is still
// refused: nothing says it ever existed.

import (
	"context"
	"errors"
	"log/slog"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

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
