package tickets_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// TestPrunedTicketKeyNeverRunsTwice: a ticket without source_event_id (nothing else dedupes it) and a comment on
// it; their responses are pruned (what IDEMPOTENCY_RETENTION does, once the clock moved past it); the same
// requests with the same keys make no second ticket and no second comment, and answer 409
// idempotency_response_expired naming the resource; GET /v1/operations/{id} says when the key expires.
func TestPrunedTicketKeyNeverRunsTwice(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	env.Idem.Retention = time.Hour
	var created tickets.CreateResult
	c.Post("/v1/tickets", ticketBody, apitest.Key("lifetime-ticket")).Status(t, http.StatusCreated).Decode(t, &created)
	c.Post("/v1/tickets/"+created.ID+"/comments", `{"body":"on it"}`, apitest.Key("lifetime-comment")).Status(t, http.StatusCreated)
	env.Clock.Advance(time.Hour + time.Minute)
	if _, _, err := env.Idem.Prune(t.Context()); err != nil {
		t.Fatal(err)
	}
	again := c.Post("/v1/tickets", ticketBody, apitest.Key("lifetime-ticket")).Status(t, http.StatusConflict).JSON(t)
	resource, _ := again["resource"].(map[string]any)
	if again["code"] != "idempotency_response_expired" || resource["type"] != "ticket" || resource["id"] != created.ID {
		t.Fatalf("retry after the prune: %v; want idempotency_response_expired naming ticket %s", again, created.ID)
	}
	c.Post("/v1/tickets/"+created.ID+"/comments", `{"body":"on it"}`, apitest.Key("lifetime-comment")).Status(t, http.StatusConflict)
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 1 {
		t.Fatalf("%d tickets after the retry; want 1", n)
	}
	if n := count(t, env, `SELECT count(*) FROM ticket_comments`); n != 1 {
		t.Fatalf("%d comments after the retry; want 1", n)
	}
	op := c.Get("/v1/operations/"+again["operation_id"].(string)).Status(t, http.StatusOK).JSON(t)
	if op["key_expires_at"] == nil || op["response_expires_at"] == nil {
		t.Fatalf("operation %v; want response_expires_at and key_expires_at", op)
	}
}
