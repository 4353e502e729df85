package tickets

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// KindCreate is the operation kind of POST /v1/tickets.
const KindCreate = "tickets.create"

// Events of a deduplicated create: the operation answered 200 deduplicated gets EventDeduplicatedAgainst (detail
// deduplicated_against), the operation that created the ticket EventDeduplicatedBy (detail deduplicated_by).
// opstatus.GetTimeline shows both links.
const (
	EventDeduplicatedAgainst = "deduplicated_against"
	EventDeduplicatedBy      = "deduplicated_by"
)

// creatorSQL finds the operation that created a ticket: the create that answered 201 with it. It runs only on
// a deduplicated create; the ticket's row is committed (its insert conflicted on it), and so is its operation,
// which committed in the same transaction. Deduplicated creates name the ticket too, and one that began before
// the creator has an earlier created_at: each records deduplicated_against with its completion, which the
// creator never does.
const creatorSQL = `
SELECT o.id FROM operations o
WHERE o.account_id = ? AND o.kind = ? AND o.resource_type = 'ticket' AND o.resource_id = ? AND o.state = 'succeeded'
  AND o.id <> ?
  AND NOT EXISTS (SELECT 1 FROM operation_events e
                  WHERE e.account_id = o.account_id AND e.operation_id = o.id AND e.type = 'deduplicated_against')
ORDER BY o.created_at, o.id LIMIT 1`

// link records, in tx, that operation opID found ticket ticketID already there, and returns the operation that
// created it ("" when none is on record: a ticket made without an operation).
func (s *Server) link(ctx context.Context, tx *gorm.DB, account, actor, ticketID, opID string) (string, error) {
	var creator []string
	if err := tx.WithContext(ctx).Raw(creatorSQL, account, KindCreate, ticketID, opID).Scan(&creator).Error; err != nil {
		return "", fmt.Errorf("tickets: creator of %s: %w", ticketID, err)
	}
	if len(creator) == 0 {
		return "", nil
	}
	if err := opstatus.Append(ctx, tx, account, opID, EventDeduplicatedAgainst, actor,
		map[string]any{"deduplicated_against": creator[0], "ticket_id": ticketID}); err != nil {
		return "", err
	}
	if err := opstatus.Append(ctx, tx, account, creator[0], EventDeduplicatedBy, actor,
		map[string]any{"deduplicated_by": opID, "ticket_id": ticketID}); err != nil {
		return "", err
	}
	return creator[0], nil
}
