package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
)

// An agent dies after the service created the ticket and before it journaled the answer; the outage outlasts
// the service's response retention, and the stored response is pruned. Resume looks the operation up, sends
// again with the same key, reads the 409 idempotency_response_expired as how the operation ended, and settles
// succeeded naming the ticket. One ticket, one operation, one key; the service recorded the retry as
// response_expired.
func TestResumeAfterThePruneSettlesWithoutANewKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.Idem.Retention = time.Hour
	stop := errors.New("died")
	a, err := agent.Open(b.journal, agent.Config{TicketsURL: b.env.URL, APIKey: servicetest.AgentSecret,
		Hook: func(p string) {
			if p == "after_answer" {
				panic(stop)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != stop {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = a.Do(context.Background(), "p", "create_ticket", ticketArgs("pruned while away"), agent.DoOptions{})
	}()
	a.Close()
	b.env.Clock.Advance(time.Hour + time.Minute) // the outage outlasts the retention
	if responses, _, err := b.env.Idem.Prune(t.Context()); err != nil || responses != 1 {
		t.Fatalf("prune: %d responses, %v; want the ticket's", responses, err)
	}

	a2 := b.open(t)
	results, err := a2.Resume(t.Context())
	if err != nil || len(results) != 1 || results[0].State != agent.StateSucceeded {
		t.Fatalf("Resume = %+v, %v; want one operation succeeded", results, err)
	}
	var body struct {
		Code     string `json:"code"`
		Resource struct {
			Type, ID string
		} `json:"resource"`
	}
	if err := json.Unmarshal(results[0].Body, &body); err != nil || body.Code != "idempotency_response_expired" ||
		body.Resource.Type != "ticket" || body.Resource.ID == "" {
		t.Errorf("result body %s; want the 409 naming the ticket", results[0].Body)
	}
	if n := b.tickets(t, "pruned while away"); n != 1 {
		t.Fatalf("%d tickets; want 1", n)
	}
	op, _ := a2.Operation("p")
	var keys, ops, expired int
	b.env.DB.Raw(`SELECT count(*) FROM operations WHERE key_state IS NOT NULL`).Scan(&keys)
	b.env.DB.Raw(`SELECT count(*) FROM operations`).Scan(&ops)
	b.env.DB.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ? AND detail->>'outcome' = 'response_expired'`,
		results[0].ServerOperationID).Scan(&expired)
	if keys != 1 || ops != 1 || expired != 1 || len(op.Attempts) != 2 {
		t.Errorf("%d keys, %d operations, %d response_expired records, %d attempts; want 1, 1, 1 and 2: the same key sent again",
			keys, ops, expired, len(op.Attempts))
	}
}
