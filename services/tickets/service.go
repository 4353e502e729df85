package tickets

import (
	"errors"
	"net/http"
	"time"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// Config configures the tickets service. Its zero value is the production service.
type Config struct {
	// Store is PostgresStore when nil.
	Store Store
	// Bypass skips idempotency on POST /v1/tickets; only the benchmark sets it, to measure what idempotency costs.
	Bypass bool
	// Approval says which new tickets need a person's approval (none by default); ApprovalTTL is how long an
	// approval may wait to be used (default an hour).
	Approval    ApprovalPolicy
	ApprovalTTL time.Duration
}

// New returns the tickets service (the template to copy for a new service: see README, "Adding a service").
func New(d service.Deps, cfg Config) (*Server, error) {
	if d.DB == nil || d.Idem == nil {
		return nil, errors.New("tickets: Deps.DB and Deps.Idem are required")
	}
	if cfg.Store == nil {
		cfg.Store = PostgresStore{}
	}
	if cfg.ApprovalTTL <= 0 {
		cfg.ApprovalTTL = time.Hour
	}
	s := &Server{DB: d.DB, Store: cfg.Store, Idem: d.Idem, Bypass: cfg.Bypass, Approval: cfg.Approval}
	s.Approvals = approval.New(d.Pool, d.Idem, cfg.ApprovalTTL,
		approval.Route{Method: http.MethodPost, Path: "/v1/tickets", Describe: s.describeTicket})
	return s, nil
}

var _ service.Service = (*Server)(nil)

// Name implements service.Service.
func (s *Server) Name() string { return "tickets" }

// Reconcilers implements service.Service: every write of tickets is local (one transaction), so no operation
// of this service is ever unknown.
func (s *Server) Reconcilers() map[string]opstatus.Reconciler { return nil }

// Workers implements service.Service: tickets has none.
func (s *Server) Workers() []service.Worker { return nil }
