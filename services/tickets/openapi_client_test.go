package tickets_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/api/client"
	"github.com/retrysafe/retrysafe/internal/servicetest"
)

// TestGeneratedClient talks to the service the way a caller with nothing but api/openapi.yaml does: through the
// client oapi-codegen generates from it (api/client). A retry replays, a changed body is a typed 422, and the
// operation can be looked up by key.
func TestGeneratedClient(t *testing.T) {
	t.Parallel()
	_, env := setup(t)
	ctx := context.Background()
	c, err := client.NewClientWithResponses(env.URL, client.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+servicetest.AgentSecret)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	high := client.TicketPriority("high")
	body := client.CreateTicket{Project: "ops", Title: "Rotate staging certificate", Priority: &high}
	params := &client.CreateTicketParams{IdempotencyKey: "generated-1"}

	first, err := c.CreateTicketWithResponse(ctx, params, body)
	if err != nil || first.JSON201 == nil || first.JSON201.Deduplicated {
		t.Fatalf("create: %v %d %s", err, first.StatusCode(), first.Body)
	}
	again, err := c.CreateTicketWithResponse(ctx, params, body)
	if err != nil || again.JSON201 == nil || again.JSON201.Id != first.JSON201.Id || again.HTTPResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %v %d %s", err, again.StatusCode(), again.Body)
	}
	body.Title = "Rotate PRODUCTION certificate"
	changed, err := c.CreateTicketWithResponse(ctx, params, body)
	if err != nil || changed.ApplicationproblemJSON422 == nil || changed.ApplicationproblemJSON422.Code != "idempotency_key_reused" {
		t.Fatalf("changed body: %v %d %s", err, changed.StatusCode(), changed.Body)
	}
	ops, err := c.ListOperationsWithResponse(ctx, &client.ListOperationsParams{IdempotencyKey: "generated-1"})
	if err != nil || ops.JSON200 == nil || len(ops.JSON200.Items) != 1 || string(ops.JSON200.Items[0].State) != "succeeded" {
		t.Fatalf("operations: %v %s", err, ops.Body)
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 1 {
		t.Fatalf("tickets = %d, want 1", n)
	}
}
