package agent_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// blackout is a transport that, while on, lets writes reach the service and loses their answers, and fails every
// read: the agent cannot learn how a write it sent ended. It counts the requests sent with a Grant-Id.
type blackout struct {
	on      atomic.Bool
	granted atomic.Int32
}

func (b *blackout) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Grant-Id") != "" {
		b.granted.Add(1)
	}
	if b.on.Load() && req.Method == http.MethodGet {
		return nil, io.ErrUnexpectedEOF
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && b.on.Load() {
		resp.Body.Close()
		return nil, io.ErrUnexpectedEOF
	}
	return resp, err
}

// TestGrantForUrgentTickets: urgent tickets need a person's approval each; a grant of tickets.create for two
// writes lets the agent create two without one, each attempt journaled with the grant's id and answered as the
// first of its operation, and stops the third needs_human grant_invalid with no ticket. A replacement of an
// urgent ticket whose outcome the agent cannot learn is held needs_human superseded_operation_unknown, grant or
// not, and sends nothing: only a person's approval of that request lets it go.
func TestGrantForUrgentTickets(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{Approval: tickets.ApprovalPolicy{Priorities: []tickets.Priority{tickets.PriorityUrgent}}})
	if err != nil {
		t.Fatal(err)
	}
	client := env.Serve(t, svc)
	p, _ := auth.Demo().Authenticate(servicetest.AgentSecret)
	g := client.As(servicetest.ApproverSecret).Post("/v1/grants", fmt.Sprintf(`{"agent_key_id":%q,"kinds":["tickets.create"],"max_uses":2,"expires_at":%q}`,
		p.KeyID, time.Now().Add(time.Hour).UTC().Format(time.RFC3339)), apitest.Key("grant-urgent")).Status(t, http.StatusCreated).Str(t, "id")
	tr := &blackout{}
	path := filepath.Join(t.TempDir(), "agent.journal")
	a, err := agent.Open(path, agent.Config{TicketsURL: env.URL, APIKey: servicetest.AgentSecret, GrantID: g, Budget: 2,
		HTTPClient: &http.Client{Transport: tr}, BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond, MaxWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	urgent := func(title string) json.RawMessage {
		raw, _ := json.Marshal(map[string]string{"project": "ops", "title": title, "priority": "urgent"})
		return raw
	}
	count := func(title string) (n int) {
		if err := env.DB.Raw(`SELECT count(*) FROM tickets WHERE title = ?`, title).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := 1; i <= 2; i++ {
		title := fmt.Sprintf("db-%d is down", i)
		if res, err := a.Do(t.Context(), fmt.Sprintf("page-%d", i), "create_ticket", urgent(title), agent.DoOptions{}); err != nil ||
			res.State != agent.StateSucceeded || count(title) != 1 {
			t.Fatalf("urgent ticket %d under the grant: %+v, %v", i, res, err)
		}
	}
	res, err := a.Do(t.Context(), "page-3", "create_ticket", urgent("db-3 is down"), agent.DoOptions{})
	if err != nil || res.State != agent.StateNeedsHuman || res.Code != agent.CodeGrantInvalid || count("db-3 is down") != 0 {
		t.Fatalf("a third urgent ticket under a grant of two: %+v, %v; want needs_human grant_invalid, no ticket", res, err)
	}
	attempts, err := agent.JournalGrants(path)
	if err != nil || len(attempts) != 3 || attempts[0].GrantID != g || attempts[0].Status != http.StatusCreated || attempts[0].Replayed ||
		attempts[2].Code != agent.CodeGrantInvalid {
		t.Fatalf("the journal's attempts under the grant: %+v, %v", attempts, err)
	}

	tr.on.Store(true)
	if res, _ := a.Do(t.Context(), "page-4", "create_ticket", urgent("db-4 is down"), agent.DoOptions{}); res.State == agent.StateSucceeded {
		t.Fatalf("page-4 settled %+v with every answer lost", res)
	}
	tr.on.Store(false)
	sent := tr.granted.Load()
	res, err = a.Do(t.Context(), "page-4b", "create_ticket", urgent("db-4 is down, on call paged"), agent.DoOptions{Supersedes: "page-4"})
	if err != nil || res.State != agent.StateNeedsHuman || res.Code != agent.CodeSupersededUnknown || res.Attempts != 0 || tr.granted.Load() != sent {
		t.Fatalf("a replacement of an unknown outcome under a grant: %+v, %v; want held needs_human %s, nothing sent",
			res, err, agent.CodeSupersededUnknown)
	}
}
