package tickets

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
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

// link records, in tx, that operation opID found ticket ticketID already there, and returns the operation that
// created it ("" when none is on record: a ticket made without an operation).
func (s *Server) link(ctx context.Context, tx *gorm.DB, account, actor, ticketID, opID string) (string, error) {
	// The creator is the create that answered 201 with the ticket. This runs only on a deduplicated create; the
	// ticket's row is committed (its insert conflicted on it), and so is its operation, which committed in the
	// same transaction. Deduplicated creates name the ticket too, and one that began before the creator has an
	// earlier created_at: each records deduplicated_against with its completion, which the creator never does.
	creator, err := opstore.Creator(ctx, database.SQL(tx), account, KindCreate, "ticket", ticketID, opID, EventDeduplicatedAgainst)
	if err != nil {
		return "", fmt.Errorf("tickets: %w", err)
	}
	if creator == "" {
		return "", nil
	}
	if err := opstatus.Append(ctx, database.SQL(tx), account, opID, EventDeduplicatedAgainst, actor,
		opstore.Link{DeduplicatedAgainst: creator, TicketID: ticketID}); err != nil {
		return "", err
	}
	if err := opstatus.Append(ctx, database.SQL(tx), account, creator, EventDeduplicatedBy, actor,
		opstore.Link{DeduplicatedBy: opID, TicketID: ticketID}); err != nil {
		return "", err
	}
	return creator, nil
}
