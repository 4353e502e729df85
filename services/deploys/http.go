package deploys

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Server is the HTTP adapter of the deploys service.
type Server struct {
	DB    *gorm.DB
	Store Store
	Idem  *idem.Handler
	// Approvals checks the approvals of deploys and rollbacks to ApprovalEnvironments; build it with
	// approval.New(..., s.ApprovalRoutes()...).
	Approvals            *approval.Service
	ApprovalEnvironments []string
	// Steps is how many simulated steps a new deploy runs.
	Steps int
	// Target, when set, is asked for its newest marker when a deploy expects an environment version newer than
	// ours (catchup.go); Logger says when an environment caught up with it.
	Target Target
	Logger *slog.Logger
}

func (s *Server) needsApproval(environment string) bool {
	return slices.Contains(s.ApprovalEnvironments, environment)
}

// accepted is the 202 of a new deploy: the controller takes it from the queue. An adopted one (makeDeploy) is
// the same answer, the deploy already succeeded, and so is its operation: the target's record says so.
func accepted(d Deploy, adopted bool) idem.Result {
	res := idem.Result{
		Status:   http.StatusAccepted,
		Body:     d,
		Header:   http.Header{"Location": {"/v1/deploys/" + d.ID}},
		Resource: &opstatus.Resource{Type: "deploy", ID: d.ID},
		State:    opstatus.StateQueued,
	}
	if adopted {
		res.State, res.Reason = opstatus.StateSucceeded, opstore.ReasonRemoteRecordFound
	}
	return res
}

func (s *Server) createDeploy(c *gin.Context) {
	var cmd CreateDeploy
	if err := httpjson.DecodeCommand(c.Request, &cmd); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	account := auth.From(c.Request.Context()).AccountID
	needsApproval, approvalID := s.needsApproval(cmd.Environment), c.GetHeader(approval.HeaderApprovalID)
	guard := s.Approvals.Guard(c.Request.Header, needsApproval)
	marker, activated := s.earlier(c.Request.Context(), account, c.GetHeader("Idempotency-Key"))
	idemgin.Do(s.Idem, c, idem.Request{Kind: KindDeploy, Command: cmd, Guard: guard, SupersedeUnknown: s.Approvals.SupersedeUnknown(c.Request.Header),
		Takes: []string{approval.HeaderApprovalID}},
		func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
			version := cmd.ExpectedEnvironmentVersion
			if version == nil && needsApproval {
				var err error
				if version, err = approvedVersion(ctx, tx, op, approvalID); err != nil {
					return idem.Result{}, err
				}
			}
			d, adopted, err := s.makeDeploy(ctx, tx, op, NewDeploy{
				AccountID: account, OperationID: op.ID, Kind: DeployForward, Service: cmd.Service,
				Environment: cmd.Environment, Reference: cmd.Reference,
				ExpectedEnvironmentVersion: version, StepsTotal: s.Steps,
			}, marker, activated)
			if err != nil {
				return idem.Result{}, err // refused (locked, version moved): nothing stored, the key stays free
			}
			return accepted(d, adopted), nil
		})
}

func (s *Server) rollbackDeploy(c *gin.Context) {
	var cmd RollbackDeploy
	if err := httpjson.DecodeActionCommand(c.Request, &cmd); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	account, id := auth.From(c.Request.Context()).AccountID, c.Param("id")
	// Only what never changes is read before the claim (a deploy's environment), so that a retry of a
	// rollback that already happened still reaches its stored answer.
	of, err := s.Store.Deploy(c.Request.Context(), s.DB, account, id)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	guard := s.Approvals.Guard(c.Request.Header, s.needsApproval(of.Environment))
	marker, activated := s.earlier(c.Request.Context(), account, c.GetHeader("Idempotency-Key"))
	idemgin.Do(s.Idem, c, idem.Request{Kind: KindRollback, Command: cmd, Guard: guard, SupersedeUnknown: s.Approvals.SupersedeUnknown(c.Request.Header),
		Takes: []string{approval.HeaderApprovalID}},
		func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
			plan, err := s.Store.RollbackPlan(ctx, tx, account, id)
			if err != nil {
				return idem.Result{}, err
			}
			d, adopted, err := s.makeDeploy(ctx, tx, op, NewDeploy{
				AccountID: account, OperationID: op.ID, Kind: DeployRollback, Service: plan.Of.Service,
				Environment: plan.Of.Environment, Reference: plan.To.Reference(), RollsBackDeployID: &plan.Of.ID,
				ExpectedEnvironmentVersion: cmd.ExpectedEnvironmentVersion, StepsTotal: s.Steps,
			}, marker, activated)
			if err != nil {
				return idem.Result{}, err
			}
			return accepted(d, adopted), nil
		})
}

// cancelDeploy declares the deploy cancelled. Like a PUT it is idempotent by itself and needs no
// Idempotency-Key: cancelling a cancelled deploy answers it again and records nothing new.
func (s *Server) cancelDeploy(c *gin.Context) {
	var none struct{}
	if err := httpjson.DecodeAction(c.Request, &none); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	p := auth.From(c.Request.Context())
	ctx := c.Request.Context()
	var (
		d         Deploy
		cancelled bool
	)
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		d, cancelled, err = s.Store.Cancel(ctx, tx, p.AccountID, c.Param("id"), p.Actor())
		return err
	})
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	if cancelled {
		opstatus.ObserveFinished(s.Idem.OperationObserver(), d.OperationKind(), StateCancelled)
	}
	s.writeStatus(c, d)
}

func (s *Server) getDeploy(c *gin.Context) {
	d, err := s.Store.Deploy(c.Request.Context(), s.DB, auth.From(c.Request.Context()).AccountID, c.Param("id"))
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	s.writeStatus(c, d)
}

// writeStatus answers a deploy with the history of its operation.
func (s *Server) writeStatus(c *gin.Context, d Deploy) {
	op, err := opstatus.Get(c.Request.Context(), database.SQL(s.DB), auth.From(c.Request.Context()).AccountID, d.OperationID)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, Status{Deploy: d, History: op.Events})
}

func (s *Server) getEnvironment(c *gin.Context) {
	env, err := s.Store.Environment(c.Request.Context(), s.DB, auth.From(c.Request.Context()).AccountID, c.Param("name"))
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, env)
}

// approvedVersion is the environment version the approval of a deploy showed its approver, which the guard
// accepted for op in tx: what the deploy replaces and whether it can be rolled back were decided on it, so
// the deploy runs at that version or not at all (CreateDeploy checks it under the environment's lock). nil for
// an approval whose card did not show one.
func approvedVersion(ctx context.Context, tx *gorm.DB, op opstatus.Operation, approvalID string) (*int64, error) {
	a, ok, err := approval.UsedBy(ctx, database.SQL(tx), op, approvalID)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("deploys: the approval %q the guard accepted is not used by operation %s", approvalID, op.ID)
	}
	shown, ok := a.Summary["environment_version"].(json.Number)
	if !ok {
		return nil, nil
	}
	v, err := shown.Int64()
	if err != nil {
		return nil, fmt.Errorf("deploys: approval %s: environment_version %s: %w", a.ID, shown, err)
	}
	return &v, nil
}

// describeDeploy is the approval.Route.Describe of POST /v1/deploys: the same decoding and validation as
// createDeploy, and what a person must see to decide. What the deploy replaces and whether it can be rolled
// back hold at one environment version: the card shows it and the approval binds it (approvedVersion). A
// request that expects another version than the environment's is refused here: its approval could never be
// used.
func (s *Server) describeDeploy(ctx context.Context, accountID string, _ map[string]string, body json.RawMessage) (any, map[string]any, error) {
	var cmd CreateDeploy
	if err := httpjson.DecodeBytes(body, &cmd); err != nil {
		return nil, nil, err
	}
	if err := cmd.Validate(); err != nil {
		return nil, nil, err
	}
	summary := map[string]any{"action": "deploy", "service": cmd.Service, "environment": cmd.Environment}
	addReference(summary, cmd.Reference)
	var env Environment // version 0 and nothing running: an environment never deployed to, as CreateDeploy makes it
	switch e, err := s.Store.Environment(ctx, s.DB, accountID, cmd.Environment); {
	case err == nil:
		env = e
	case !errors.Is(err, problem.ErrNotFound):
		return nil, nil, err
	}
	if v := cmd.ExpectedEnvironmentVersion; v != nil {
		if *v != env.Version {
			return nil, nil, versionMismatch(cmd.Environment, env.Version, *v)
		}
		summary["expected_environment_version"] = *v
	}
	summary["environment_version"] = env.Version
	summary["replaces_deploy_id"] = env.CurrentDeployID
	summary["can_roll_back"] = env.CurrentDeployID != nil
	return cmd, summary, nil
}

// describeRollback is the approval.Route.Describe of POST /v1/deploys/{id}/rollback; its summary names the
// rollback target.
func (s *Server) describeRollback(ctx context.Context, accountID string, params map[string]string, body json.RawMessage) (any, map[string]any, error) {
	var cmd RollbackDeploy
	if err := httpjson.DecodeBytes(body, &cmd); err != nil {
		return nil, nil, err
	}
	if err := cmd.Validate(); err != nil {
		return nil, nil, err
	}
	plan, err := s.Store.RollbackPlan(ctx, s.DB, accountID, params["id"])
	if err != nil {
		return nil, nil, err
	}
	summary := map[string]any{
		"action": "rollback", "service": plan.Of.Service, "environment": plan.Of.Environment,
		"rolls_back_deploy_id": plan.Of.ID, "rolls_back_reference": plan.Of.Reference().String(),
		"rollback_target_deploy_id": plan.To.ID, "rollback_target": plan.To.Reference().String(),
	}
	addReference(summary, plan.To.Reference())
	if cmd.ExpectedEnvironmentVersion != nil {
		summary["expected_environment_version"] = *cmd.ExpectedEnvironmentVersion
	}
	return cmd, summary, nil
}

// addReference names what will be deployed the way the request does: artifact or commit_sha.
func addReference(summary map[string]any, ref Reference) {
	if ref.Artifact != "" {
		summary["artifact"] = ref.Artifact
	} else {
		summary["commit_sha"] = ref.CommitSHA
	}
}
