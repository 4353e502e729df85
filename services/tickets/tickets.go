// Package tickets is the support-ticket service of retrysafe: tickets deduplicated by the event that caused
// them, comments that a retry never doubles, and a status that is declared rather than toggled.
//
// This file holds the domain: the types, the commands the service accepts with their validation, and the store
// interface. store.go implements the store on gorm + PostgreSQL; http.go and routes.go are the HTTP adapter.
package tickets

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Priority of a ticket.
type Priority string

const (
	PriorityLow    Priority = "low"
	PriorityNormal Priority = "normal"
	PriorityHigh   Priority = "high"
	PriorityUrgent Priority = "urgent"
)

// Status of a ticket.
type Status string

const (
	StatusOpen     Status = "open"
	StatusResolved Status = "resolved"
	StatusClosed   Status = "closed"
)

// Ticket is a support ticket.
type Ticket struct {
	ID            string    `json:"id"`
	AccountID     string    `json:"-"`
	Project       string    `json:"project"`
	Title         string    `json:"title"`
	Description   string    `json:"description"`
	Priority      Priority  `json:"priority"`
	Status        Status    `json:"status"`
	SourceEventID *string   `json:"source_event_id"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// Comment is a comment on a ticket.
type Comment struct {
	ID        string    `json:"id"`
	TicketID  string    `json:"ticket_id"`
	Body      string    `json:"body"`
	CreatedAt time.Time `json:"created_at"`
}

// StatusChange is one change of a ticket's status that actually happened.
type StatusChange struct {
	// ID orders the changes of a ticket (the page cursor); callers do not see it.
	ID        int64     `json:"-"`
	From      Status    `json:"from"`
	To        Status    `json:"to"`
	Actor     string    `json:"actor"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateTicket is the command of POST /v1/tickets. After Validate it carries its defaults, so two requests
// that differ only by an omitted default have one fingerprint.
type CreateTicket struct {
	Project       string    `json:"project"`
	Title         string    `json:"title"`
	Description   *string   `json:"description,omitempty"`
	Priority      *Priority `json:"priority,omitempty"`
	SourceEventID *string   `json:"source_event_id,omitempty"`
}

// Validate checks the command and applies defaults (priority normal, empty description).
func (cmd *CreateTicket) Validate() error {
	var errs []problem.FieldError
	errs = problem.CheckText(errs, "project", cmd.Project, 100, true)
	errs = problem.CheckText(errs, "title", cmd.Title, 200, true)
	if cmd.Description == nil {
		cmd.Description = new(string)
	}
	errs = problem.CheckMultilineText(errs, "description", *cmd.Description, 10000, false)
	if cmd.Priority == nil {
		p := PriorityNormal
		cmd.Priority = &p
	}
	switch *cmd.Priority {
	case PriorityLow, PriorityNormal, PriorityHigh, PriorityUrgent:
	default:
		errs = append(errs, problem.FieldError{Field: "priority", Message: "must be one of low, normal, high, urgent"})
	}
	if cmd.SourceEventID != nil {
		errs = problem.CheckText(errs, "source_event_id", *cmd.SourceEventID, 255, true)
	}
	if len(errs) > 0 {
		return problem.Validation(errs...)
	}
	return nil
}

// AddComment is the command of POST /v1/tickets/{id}/comments.
type AddComment struct {
	Body string `json:"body"`
}

// Validate checks the command.
func (cmd *AddComment) Validate() error {
	if errs := problem.CheckMultilineText(nil, "body", cmd.Body, 10000, true); len(errs) > 0 {
		return problem.Validation(errs...)
	}
	return nil
}

// SetStatus is the command of PUT /v1/tickets/{id}/status.
type SetStatus struct {
	Status Status `json:"status"`
}

// Validate checks the command.
func (cmd *SetStatus) Validate() error {
	switch cmd.Status {
	case StatusOpen, StatusResolved, StatusClosed:
		return nil
	}
	return problem.Validation(problem.FieldError{Field: "status", Message: "must be one of open, resolved, closed"})
}

// Store keeps tickets. Methods that write take the caller's transaction (the one holding the idempotency
// claim). Every method is scoped to one account.
type Store interface {
	// CreateTicket inserts a ticket, or, when the account already has a ticket for cmd.SourceEventID, returns
	// that one with created=false. Concurrent creates for one source event make one ticket.
	CreateTicket(ctx context.Context, tx *gorm.DB, accountID string, cmd CreateTicket) (t Ticket, created bool, err error)
	// Ticket returns a ticket. Returns an error matching problem.ErrNotFound if it does not exist in the account.
	Ticket(ctx context.Context, db *gorm.DB, accountID, id string) (Ticket, error)
	// Tickets lists the account's tickets, newest first, optionally only the one of a source event: at most
	// p.Fetch() of them, after p.After.
	Tickets(ctx context.Context, db *gorm.DB, accountID string, sourceEventID *string, p page.Request) ([]Ticket, error)
	// AddComment adds a comment. Returns an error matching problem.ErrNotFound if the ticket does not exist.
	AddComment(ctx context.Context, tx *gorm.DB, accountID, ticketID string, cmd AddComment) (Comment, error)
	// Comments lists a ticket's comments, oldest first, at most p.Fetch() after p.After. Returns
	// problem.ErrNotFound if the ticket does not exist.
	Comments(ctx context.Context, db *gorm.DB, accountID, ticketID string, p page.Request) ([]Comment, error)
	// SetStatus declares the ticket's status. It changes the ticket and records a StatusChange only when the
	// status differs; changed says which. Returns an error matching problem.ErrNotFound if the ticket does not exist.
	SetStatus(ctx context.Context, db *gorm.DB, accountID, ticketID string, to Status, actor string) (t Ticket, changed bool, err error)
	// StatusChanges lists a ticket's status changes, oldest first, at most p.Fetch() after p.After. Returns
	// problem.ErrNotFound if the ticket does not exist.
	StatusChanges(ctx context.Context, db *gorm.DB, accountID, ticketID string, p page.Request) ([]StatusChange, error)
}
