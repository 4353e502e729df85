package agent_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// The tickets service's approval policy: an urgent ticket (a configured priority) is not created without a
// person's approval. The agent stops needs_human approval_required, asks for an approval whose card shows the
// project and title, and creates the ticket, once, with the approval id; a normal ticket needs none.
func TestTicketApprovalPolicy(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{Approval: tickets.ApprovalPolicy{Priorities: []tickets.Priority{tickets.PriorityUrgent}}})
	if err != nil {
		t.Fatal(err)
	}
	client := env.Serve(t, svc)
	count := func(title string) (n int) {
		if err := env.DB.Raw(`SELECT count(*) FROM tickets WHERE title = ?`, title).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}
	a, err := agent.Open(filepath.Join(t.TempDir(), "agent.journal"), agent.Config{TicketsURL: env.URL, APIKey: servicetest.AgentSecret,
		BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	urgent := json.RawMessage(`{"project":"ops","title":"Page the on-call: db-2 is down","priority":"urgent"}`)
	res, err := a.Do(t.Context(), "page-1", "create_ticket", urgent, agent.DoOptions{})
	if err != nil || res.State != agent.StateNeedsHuman || res.Code != "approval_required" {
		t.Fatalf("urgent ticket: %+v, %v; want needs_human approval_required", res, err)
	}
	if n := count("Page the on-call: db-2 is down"); n != 0 {
		t.Fatalf("%d tickets before the approval; want 0", n)
	}
	asked, err := a.Do(t.Context(), "page-1-approval", "request_approval", json.RawMessage(`{"for_action":"page-1"}`), agent.DoOptions{})
	if err != nil || asked.State != agent.StateSucceeded || asked.ApprovalID == "" {
		t.Fatalf("request_approval: %+v, %v", asked, err)
	}
	approver := client.As(servicetest.ApproverSecret)
	card := approver.Get("/v1/approvals/"+asked.ApprovalID).Status(t, http.StatusOK).JSON(t)["summary"].(map[string]any)
	if card["project"] != "ops" || card["title"] != "Page the on-call: db-2 is down" || card["priority"] != "urgent" ||
		card["needs_approval_because"] != "priority urgent needs an approval" {
		t.Fatalf("the approval card: %v; want project, title, priority and why", card)
	}
	approver.Post("/v1/approvals/"+asked.ApprovalID+"/approve", nil).Status(t, http.StatusOK)
	approved := json.RawMessage(`{"project":"ops","title":"Page the on-call: db-2 is down","priority":"urgent","approval_id":"` + asked.ApprovalID + `"}`)
	if res, err := a.Do(t.Context(), "page-1", "create_ticket", approved, agent.DoOptions{}); err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("with the approval: %+v, %v", res, err)
	}
	if n := count("Page the on-call: db-2 is down"); n != 1 {
		t.Fatalf("%d tickets after the approval; want 1", n)
	}
	if res, err := a.Do(t.Context(), "normal-1", "create_ticket", ticketArgs("a normal ticket"), agent.DoOptions{}); err != nil ||
		res.State != agent.StateSucceeded || count("a normal ticket") != 1 {
		t.Fatalf("a normal ticket: %+v, %v; want it created without an approval", res, err)
	}
}
