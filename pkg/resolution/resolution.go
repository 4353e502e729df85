// Package resolution serves a person's decision on an operation whose outcome is unknown: POST
// /v1/operations/{id}/resolution, on every service, and the same decision from the console's operation page
// (package service wires both). The decision is an idempotent write (package idem): its Idempotency-Key makes
// a repeated decision a replay, and its record (opstore.EventOperatorDecision) and the release of what the
// operation held (the Resolver of its kind) commit together.
package resolution

import (
	"context"
	"net/http"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Path is the route of a decision as its operations record it (gin's template, which they have always named);
// approver keys may send it (auth.AgentWrites).
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
// nothing (Resolve refuses a kind of any other service).
type Decider struct {
	Idem      *idem.Handler
	Resolvers map[string]Resolver
	Services  []string
}

// Routes is POST /v1/operations/{id}/resolution, keyed by its ServeMux pattern; it must be behind
// auth.Middleware. A gin router mounts it with httpserver.Mount.
func (d *Decider) Routes() map[string]http.Handler {
	return map[string]http.Handler{"POST /v1/operations/{id}/resolution": http.HandlerFunc(d.serve)}
}

func (d *Decider) serve(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !ids.Valid("op_", id) {
		problem.Write(w, r, problem.NotFound("operation"))
		return
	}
	if err := mayDecide(r.Context()); err != nil {
		problem.Write(w, r, err)
		return
	}
	var dec opstatus.Decision
	if err := httpjson.Decode(r, &dec); err != nil {
		problem.Write(w, r, err)
		return
	}
	call := idem.HTTPCall(r)
	call.Route = Path // the route operations record, the form's decisions too (DecideForm)
	idem.WriteAnswer(w, r, d.decide(r.Context(), call, id, dec))
}

// DecideForm records the decision of a form on r (the console's operation page, behind its session and CSRF
// check) on operation id under Idempotency-Key key, exactly as the API would: the same key sent both ways is
// one decision. It returns the problem that refused it, if any.
func (d *Decider) DecideForm(r *http.Request, id, key string, dec opstatus.Decision) error {
	if err := mayDecide(r.Context()); err != nil {
		return err
	}
	call := idem.HTTPCall(r)
	call.Method, call.Route, call.Params = http.MethodPost, Path, map[string]string{"id": id}
	call.Header = http.Header{"Idempotency-Key": {key}}
	return d.decide(r.Context(), call, id, dec).Err
}

// mayDecide refuses any key but an approver's before anything is read or claimed.
func mayDecide(ctx context.Context) error {
	if auth.From(ctx).Role != auth.RoleApprover {
		return problem.New("forbidden", "only a key with role approver can decide an operation's outcome: nothing was done")
	}
	return nil
}

func (d *Decider) decide(ctx context.Context, call idem.Call, id string, dec opstatus.Decision) idem.Answer {
	// Validated first: a refused decision never burns its key.
	if err := dec.Validate(); err != nil {
		return idem.Answer{Err: err}
	}
	p := auth.From(ctx)
	return d.Idem.Run(ctx, call, idem.Request{Kind: Kind, Command: command{OperationID: id, Decision: dec}},
		func(ctx context.Context, tx *gorm.DB, _ opstatus.Operation) (idem.Result, error) {
			op, err := Resolve(ctx, tx, p.AccountID, id, p.Actor(), dec, d.Resolvers, d.Services)
			if err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: http.StatusOK, Body: op, Resource: &opstatus.Resource{Type: "operation", ID: id}}, nil
		})
}
