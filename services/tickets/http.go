package tickets

import (
	"context"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/page"
)

// Server is the HTTP adapter of the tickets service.
type Server struct {
	DB    *gorm.DB
	Store Store
	Idem  *idem.Handler
	// Bypass skips idempotency on POST /v1/tickets; only the benchmark sets it, to measure what idempotency costs.
	Bypass bool
	// Approvals checks the approvals of new tickets that Approval says need one.
	Approvals *approval.Service
	Approval  ApprovalPolicy
}

// CreateResult is the answer to POST /v1/tickets: the ticket, and whether it already existed for its
// source_event_id (200, deduplicated) or was created (201).
type CreateResult struct {
	Ticket
	Deduplicated bool `json:"deduplicated"`
	// DeduplicatedAgainst is, on a deduplicated answer, the operation that created the ticket: a retry of that
	// operation under another key, or another request that happened to carry the same source_event_id.
	DeduplicatedAgainst string `json:"deduplicated_against,omitempty"`
}

func (s *Server) createTicket(c *gin.Context) {
	var cmd CreateTicket
	if err := httpjson.DecodeCommand(c.Request, &cmd); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	account, actor := auth.From(c.Request.Context()).AccountID, auth.From(c.Request.Context()).Actor()
	if s.Bypass {
		res, err := s.create(c.Request.Context(), s.DB, account, actor, cmd, nil)
		if err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		httpserver.JSON(c, res.Status, res.Body)
		return
	}
	// A ticket with a source_event_id may be deduplicated, and a deduplicated answer links its operation to the
	// one that created the ticket, so that operation must exist in the write's transaction.
	idemgin.Do(s.Idem, c, idem.Request{Kind: KindCreate, Command: cmd, Guard: s.Approvals.Guard(c.Request.Header, s.Approval.needs(cmd)),
		SupersedeUnknown: s.Approvals.SupersedeUnknown(c.Request.Header), Takes: []string{approval.HeaderApprovalID}},
		func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
			return s.create(ctx, tx, account, actor, cmd, &op)
		})
}

// create creates the ticket in tx. When it already existed for its source_event_id and op is the write's
// operation, both op and the operation that created the ticket record the link (link).
func (s *Server) create(ctx context.Context, tx *gorm.DB, account, actor string, cmd CreateTicket, op *opstatus.Operation) (idem.Result, error) {
	t, created, err := s.Store.CreateTicket(ctx, tx, account, cmd)
	if err != nil {
		return idem.Result{}, err
	}
	status := http.StatusCreated
	body := CreateResult{Ticket: t, Deduplicated: !created}
	if !created {
		status = http.StatusOK
		if op != nil {
			if body.DeduplicatedAgainst, err = s.link(ctx, tx, account, actor, t.ID, op.ID); err != nil {
				return idem.Result{}, err
			}
		}
	}
	return idem.Result{
		Status:   status,
		Body:     body,
		Header:   http.Header{"Location": {"/v1/tickets/" + t.ID}},
		Resource: &opstatus.Resource{Type: "ticket", ID: t.ID},
	}, nil
}

func (s *Server) getTicket(c *gin.Context) {
	t, err := s.Store.Ticket(c.Request.Context(), s.DB, auth.From(c.Request.Context()).AccountID, c.Param("id"))
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, t)
}

func (s *Server) listTickets(c *gin.Context) {
	var sourceEventID *string
	if v, ok := c.GetQuery("source_event_id"); ok {
		sourceEventID = &v
	}
	p, err := page.FromQuery(c.Request.URL.Query())
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	ts, err := s.Store.Tickets(c.Request.Context(), s.DB, auth.From(c.Request.Context()).AccountID, sourceEventID, p)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, page.Of(ts, p, func(t Ticket) page.Cursor { return page.Cursor{At: t.CreatedAt, ID: t.ID} }))
}

func (s *Server) addComment(c *gin.Context) {
	var cmd AddComment
	if err := httpjson.DecodeCommand(c.Request, &cmd); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	account, ticketID := auth.From(c.Request.Context()).AccountID, c.Param("id")
	idemgin.Do(s.Idem, c, idem.Request{Kind: "tickets.comment", Command: cmd},
		func(ctx context.Context, tx *gorm.DB, _ opstatus.Operation) (idem.Result, error) {
			cm, err := s.Store.AddComment(ctx, tx, account, ticketID, cmd)
			if err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: http.StatusCreated, Body: cm, Resource: &opstatus.Resource{Type: "comment", ID: cm.ID}}, nil
		})
}

func (s *Server) listComments(c *gin.Context) {
	p, err := page.FromQuery(c.Request.URL.Query())
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	cs, err := s.Store.Comments(c.Request.Context(), s.DB, auth.From(c.Request.Context()).AccountID, c.Param("id"), p)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, page.Of(cs, p, func(cm Comment) page.Cursor { return page.Cursor{At: cm.CreatedAt, ID: cm.ID} }))
}

// setStatus declares a status. PUT is idempotent by itself: the same status twice changes nothing the second
// time and records no second change, so it needs no Idempotency-Key.
func (s *Server) setStatus(c *gin.Context) {
	var cmd SetStatus
	if err := httpjson.DecodeCommand(c.Request, &cmd); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	p := auth.From(c.Request.Context())
	t, _, err := s.Store.SetStatus(c.Request.Context(), s.DB, p.AccountID, c.Param("id"), cmd.Status, p.Actor())
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, t)
}

func (s *Server) listStatusChanges(c *gin.Context) {
	p, err := page.FromQuery(c.Request.URL.Query())
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	changes, err := s.Store.StatusChanges(c.Request.Context(), s.DB, auth.From(c.Request.Context()).AccountID, c.Param("id"), p)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, page.Of(changes, p, func(sc StatusChange) page.Cursor {
		return page.Cursor{At: sc.CreatedAt, ID: strconv.FormatInt(sc.ID, 10)}
	}))
}
