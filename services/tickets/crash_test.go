package tickets_test

import (
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
)

// TestKilledAfterClaimLeavesNothing kills the real server process (SIGKILL) after it claimed the key and before
// it committed: local mode keeps the claim, the ticket and the response in one transaction, so the database
// holds none of them, the key is free, and the retry creates exactly one ticket.
func TestKilledAfterClaimLeavesNothing(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	bin := proctest.Build(t)
	env := map[string]string{"DATABASE_URL": db.DSN}

	crashing := proctest.Start(t, bin, []string{"serve", "tickets"},
		map[string]string{"DATABASE_URL": db.DSN, "RETRYSAFE_FAILPOINTS": "idem.after_claim" + "=pause"}, "TICKETS_ADDR")
	c := apitest.New(t, crashing.URL, servicetest.AgentSecret)
	sent := make(chan error, 1)
	go func() {
		_, err := c.Try(http.MethodPost, "/v1/tickets", ticketBody, apitest.Key("crash-1"))
		sent <- err
	}()
	crashing.WaitFor(t, "failpoint "+"idem.after_claim"+" reached")
	crashing.Kill(t)
	if err := <-sent; err == nil {
		t.Fatal("the caller got an answer from a killed server")
	}

	var tickets, keys, ops int64
	db.Raw(`SELECT count(*) FROM tickets`).Scan(&tickets)
	db.Raw(`SELECT count(*) FROM operations WHERE key_state IS NOT NULL`).Scan(&keys)
	db.Raw(`SELECT count(*) FROM operations`).Scan(&ops)
	if tickets != 0 || keys != 0 || ops != 0 {
		t.Fatalf("after the crash: %d tickets, %d keys, %d operations; want nothing", tickets, keys, ops)
	}

	restarted := proctest.Start(t, bin, []string{"serve", "tickets"}, env, "TICKETS_ADDR")
	retry := apitest.New(t, restarted.URL, servicetest.AgentSecret).
		Post("/v1/tickets", ticketBody, apitest.Key("crash-1")).Status(t, http.StatusCreated)
	if retry.Header.Get("Idempotent-Replayed") == "true" {
		t.Error("the retry after the crash was a replay of something that never committed")
	}
	db.Raw(`SELECT count(*) FROM tickets`).Scan(&tickets)
	if tickets != 1 {
		t.Fatalf("tickets after the retry = %d, want 1", tickets)
	}
}
