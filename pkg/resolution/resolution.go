// Package resolution serves a person's decision on an operation whose outcome is unknown: POST
// /v1/operations/{id}/resolution, on every service, and the same decision from the console's operation page
// (package service wires both). The decision is an idempotent write (package idem): its Idempotency-Key makes
// a repeated decision a replay, and its record (opstore.EventOperatorDecision) and the release of what the
// operation held (the opstatus.Resolver of its kind) commit together.
package resolution

import (
	"context"
	"net/http"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Path is the route of a decision; approver keys may send it (auth.AgentWrites).
const Path = "/v1/operations/:id/resolution"

// Kind is the operation kind of a decision.
const Kind = "operations.resolve"

// command is what a decision's fingerprint covers: the operation decided on and the decision.
type command struct {
	OperationID string `json:"operation_id"`
	opstatus.Decision
}

// Decider records decisions through Idem; Resolvers, by operation kind, release what an operation of that
// kind held; Services are the names of the services the process runs, whose kinds without a Resolver hold
// nothing (opstatus.Resolve refuses a kind of any other service).
type Decider struct {
	Idem      *idem.Handler
	Resolvers map[string]opstatus.Resolver
	Services  []string
}

// Routes registers POST /v1/operations/{id}/resolution on r, which must be behind auth.Middleware.
func (d *Decider) Routes(r gin.IRouter) {
	r.POST(Path, httpserver.PathID("id", "op_", "operation"), func(c *gin.Context) {
		if err := mayDecide(c); err != nil {
			problem.Write(c, err)
			return
		}
		var dec opstatus.Decision
		if err := httpserver.DecodeJSON(c, &dec); err != nil {
			problem.Write(c, err)
			return
		}
		idemgin.Write(c, d.decide(c, idemgin.Call(c), c.Param("id"), dec))
	})
}

// DecideForm records the decision of a form on c (the console's operation page, behind its session and CSRF
// check) on operation id under Idempotency-Key key, exactly as the API would: the same key sent both ways is
// one decision. It returns the problem that refused it, if any.
func (d *Decider) DecideForm(c *gin.Context, id, key string, dec opstatus.Decision) error {
	if err := mayDecide(c); err != nil {
		return err
	}
	call := idemgin.Call(c)
	call.Method, call.Route, call.Params = http.MethodPost, Path, map[string]string{"id": id}
	call.Header = http.Header{"Idempotency-Key": {key}}
	return d.decide(c, call, id, dec).Err
}

// mayDecide refuses any key but an approver's before anything is read or claimed.
func mayDecide(c *gin.Context) error {
	if auth.From(c).Role != auth.RoleApprover {
		return problem.New(problem.CodeForbidden, "only a key with role approver can decide an operation's outcome: nothing was done")
	}
	return nil
}

func (d *Decider) decide(c *gin.Context, call idem.Call, id string, dec opstatus.Decision) idem.Answer {
	// Validated first: a refused decision never burns its key.
	if err := dec.Validate(); err != nil {
		return idem.Answer{Err: err}
	}
	p := auth.From(c)
	return d.Idem.Run(c.Request.Context(), call, idem.Request{Kind: Kind, Command: command{OperationID: id, Decision: dec}},
		func(ctx context.Context, tx *gorm.DB, _ opstatus.Operation) (idem.Result, error) {
			op, err := opstatus.Resolve(ctx, tx, p.AccountID, id, p.Actor(), dec, d.Resolvers, d.Services)
			if err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: http.StatusOK, Body: op, Resource: &opstatus.Resource{Type: "operation", ID: id}}, nil
		})
}
