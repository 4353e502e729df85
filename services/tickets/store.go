package tickets

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// PostgresStore is the Store on gorm + PostgreSQL.
type PostgresStore struct{}

var _ Store = PostgresStore{}

const ticketColumns = `id, account_id, project, title, description, priority, status, source_event_id, created_at, updated_at`

// The insert of a ticket. A ticket with a source event is inserted ON CONFLICT DO NOTHING on the partial unique
// index tickets_source_event; one without cannot conflict there, and is a plain insert (no speculative insertion
// and its confirmation to write).
const (
	insertTicketSQL = `
INSERT INTO tickets (id, account_id, project, title, description, priority, status, source_event_id)
VALUES ($1, $2, $3, $4, $5, $6, 'open', $7)
RETURNING ` + ticketColumns
	insertSourcedTicketSQL = `
INSERT INTO tickets (id, account_id, project, title, description, priority, status, source_event_id)
VALUES ($1, $2, $3, $4, $5, $6, 'open', $7)
ON CONFLICT (account_id, source_event_id) WHERE source_event_id IS NOT NULL DO NOTHING
RETURNING ` + ticketColumns
)

// CreateTicket implements Store. The insert goes through database.Query, so that in an idempotent write it is
// the transaction's first statement and carries the claim (one round trip for both); the rest of the store is
// gorm. The partial unique index tickets_source_event decides between concurrent creates of one source event:
// ON CONFLICT DO NOTHING waits for the other transaction, and the statement after it reads the winner.
func (PostgresStore) CreateTicket(ctx context.Context, tx *gorm.DB, accountID string, cmd CreateTicket) (Ticket, bool, error) {
	query := insertTicketSQL
	if cmd.SourceEventID != nil {
		query = insertSourcedTicketSQL
	}
	var t Ticket
	created := false
	err := database.Query(ctx, tx, query,
		[]any{ids.New("tkt_"), accountID, cmd.Project, cmd.Title, *cmd.Description, string(*cmd.Priority), cmd.SourceEventID},
		func(rows pgx.Rows) error {
			if created = rows.Next(); created {
				if err := rows.Scan(&t.ID, &t.AccountID, &t.Project, &t.Title, &t.Description, &t.Priority, &t.Status,
					&t.SourceEventID, &t.CreatedAt, &t.UpdatedAt); err != nil {
					return err
				}
			}
			return rows.Err()
		})
	if err != nil {
		return Ticket{}, false, fmt.Errorf("tickets: create: %w", err)
	}
	if created {
		return t, true, nil
	}
	existing, err := PostgresStore{}.Tickets(ctx, tx, accountID, cmd.SourceEventID, page.Request{Limit: 1})
	if err != nil {
		return Ticket{}, false, err
	}
	if len(existing) == 0 {
		return Ticket{}, false, fmt.Errorf("tickets: create: source event %q conflicted but no ticket is visible", *cmd.SourceEventID)
	}
	return existing[0], false, nil
}

// Ticket implements Store.
func (PostgresStore) Ticket(ctx context.Context, db *gorm.DB, accountID, id string) (Ticket, error) {
	var rows []Ticket
	err := db.WithContext(ctx).Raw(`SELECT `+ticketColumns+` FROM tickets WHERE id = ? AND account_id = ?`, id, accountID).
		Scan(&rows).Error
	if err != nil {
		return Ticket{}, fmt.Errorf("tickets: get: %w", err)
	}
	if len(rows) == 0 {
		return Ticket{}, problem.NotFound("ticket")
	}
	return rows[0], nil
}

// Tickets implements Store.
func (PostgresStore) Tickets(ctx context.Context, db *gorm.DB, accountID string, sourceEventID *string, p page.Request) ([]Ticket, error) {
	q := db.WithContext(ctx).Table("tickets").Select(ticketColumns).Where("account_id = ?", accountID)
	if sourceEventID != nil {
		q = q.Where("source_event_id = ?", *sourceEventID)
	}
	if p.After != nil {
		q = q.Where("(created_at, id) < (?, ?)", p.After.At, p.After.ID)
	}
	rows := []Ticket{}
	if err := q.Order("created_at DESC, id DESC").Limit(p.Fetch()).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("tickets: list: %w", err)
	}
	return rows, nil
}

// AddComment implements Store.
func (PostgresStore) AddComment(ctx context.Context, tx *gorm.DB, accountID, ticketID string, cmd AddComment) (Comment, error) {
	var rows []Comment
	err := tx.WithContext(ctx).Raw(`
INSERT INTO ticket_comments (id, ticket_id, account_id, body)
SELECT ?, id, account_id, ? FROM tickets WHERE id = ? AND account_id = ?
RETURNING id, ticket_id, body, created_at`, ids.New("cmt_"), cmd.Body, ticketID, accountID).Scan(&rows).Error
	if err != nil {
		return Comment{}, fmt.Errorf("tickets: add comment: %w", err)
	}
	if len(rows) == 0 {
		return Comment{}, problem.NotFound("ticket")
	}
	return rows[0], nil
}

// Comments implements Store.
func (PostgresStore) Comments(ctx context.Context, db *gorm.DB, accountID, ticketID string, p page.Request) ([]Comment, error) {
	if _, err := (PostgresStore{}).Ticket(ctx, db, accountID, ticketID); err != nil {
		return nil, err
	}
	q := db.WithContext(ctx).Table("ticket_comments").Select("id, ticket_id, body, created_at").
		Where("ticket_id = ? AND account_id = ?", ticketID, accountID)
	if p.After != nil {
		q = q.Where("(created_at, id) > (?, ?)", p.After.At, p.After.ID)
	}
	rows := []Comment{}
	err := q.Order("created_at, id").Limit(p.Fetch()).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("tickets: comments: %w", err)
	}
	return rows, nil
}

// SetStatus implements Store. One statement changes the status only if it differs and records the change.
func (PostgresStore) SetStatus(ctx context.Context, db *gorm.DB, accountID, ticketID string, to Status, actor string) (Ticket, bool, error) {
	var changed []Ticket
	err := db.WithContext(ctx).Raw(`
WITH prev AS (
    SELECT account_id, id, status FROM tickets WHERE id = ? AND account_id = ? FOR UPDATE
), t AS (
    UPDATE tickets SET status = ?, updated_at = now()
    FROM prev WHERE tickets.account_id = prev.account_id AND tickets.id = prev.id AND prev.status <> ?
    RETURNING tickets.*, prev.status AS from_status
), change AS (
    INSERT INTO ticket_status_changes (ticket_id, account_id, from_status, to_status, actor)
    SELECT id, account_id, from_status, status, ? FROM t
)
SELECT `+ticketColumns+` FROM t`, ticketID, accountID, to, to, actor).Scan(&changed).Error
	if err != nil {
		return Ticket{}, false, fmt.Errorf("tickets: set status: %w", err)
	}
	if len(changed) == 1 {
		return changed[0], true, nil
	}
	t, err := PostgresStore{}.Ticket(ctx, db, accountID, ticketID)
	return t, false, err
}

// StatusChanges implements Store.
func (PostgresStore) StatusChanges(ctx context.Context, db *gorm.DB, accountID, ticketID string, p page.Request) ([]StatusChange, error) {
	if _, err := (PostgresStore{}).Ticket(ctx, db, accountID, ticketID); err != nil {
		return nil, err
	}
	// Changes are ordered by their id; the cursor carries it as text.
	after := int64(0)
	if p.After != nil {
		n, err := strconv.ParseInt(p.After.ID, 10, 64)
		if err != nil {
			return nil, problem.New("invalid_request", "cursor is not one this list gave")
		}
		after = n
	}
	rows := []StatusChange{}
	err := db.WithContext(ctx).Raw(`SELECT id, from_status AS "from", to_status AS "to", actor, created_at
FROM ticket_status_changes WHERE ticket_id = ? AND account_id = ? AND id > ? ORDER BY id LIMIT ?`,
		ticketID, accountID, after, p.Fetch()).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("tickets: status changes: %w", err)
	}
	return rows, nil
}
