// Package resolution serves a person's decision on an operation whose outcome is unknown: POST
// /v1/operations/{id}/resolution, on every service (package service mounts it). The decision is an
// idempotent write (package idem): its Idempotency-Key makes a repeated decision a replay, and its record
// (opstatus.EventOperatorDecision) and the release of what the operation held (the opstatus.Resolver of its
// kind) commit together.
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

// Routes registers POST /v1/operations/{id}/resolution on r, which must be behind auth.Middleware.
// resolvers, by operation kind, release what an operation of that kind held.
func Routes(r gin.IRouter, h *idem.Handler, resolvers map[string]opstatus.Resolver) {
	r.POST(Path, httpserver.PathID("id", "op_", "operation"), func(c *gin.Context) {
		p := auth.From(c)
		if p.Role != auth.RoleApprover {
			problem.Write(c, problem.New(problem.CodeForbidden,
				"only a key with role approver can decide an operation's outcome: nothing was done"))
			return
		}
		var d opstatus.Decision
		if err := httpserver.DecodeJSON(c, &d); err != nil {
			problem.Write(c, err)
			return
		}
		if err := d.Validate(); err != nil {
			problem.Write(c, err)
			return
		}
		id := c.Param("id")
		idemgin.Do(h, c, idem.Request{Kind: Kind, Command: command{OperationID: id, Decision: d}, OperationAtCompletion: true},
			func(ctx context.Context, tx *gorm.DB, _ opstatus.Operation) (idem.Result, error) {
				op, err := opstatus.Resolve(ctx, tx, p.AccountID, id, p.Actor(), d, resolvers)
				if err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: http.StatusOK, Body: op, Resource: &opstatus.Resource{Type: "operation", ID: id}}, nil
			})
	})
}
