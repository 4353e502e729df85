package tickets_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
)

// TestStatelessReplicas runs three `serve tickets` processes on one database and sends 50 keys, six concurrent
// copies of each, spread over the three: nothing but the database decides, so each key makes one ticket and one
// operation, and its six copies get the same answer, byte for byte (one created, five replayed).
func TestStatelessReplicas(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	bin := proctest.Build(t)
	env := map[string]string{"DATABASE_URL": db.DSN, "DB_MAX_CONNS": "4", "RATE_LIMIT_WRITES_PER_SECOND": "0"}
	var clients []*apitest.Client
	for _, p := range proctest.StartReplicas(t, bin, 3, []string{"serve", "tickets"}, env, "TICKETS_ADDR") {
		clients = append(clients, apitest.New(t, p.URL, servicetest.AgentSecret))
	}

	const keys, copies = 50, 6
	answers := apitest.Copies{Clients: clients, Requests: keys, Copies: copies,
		Send: func(c *apitest.Client, k int) (*apitest.Response, error) {
			body := fmt.Sprintf(`{"project":"replicas","title":"key %d","priority":"normal"}`, k)
			return c.Try(http.MethodPost, "/v1/tickets", body, apitest.Key(fmt.Sprintf("replica-%d", k)))
		}}.Run()
	apitest.AgreeOnce(t, answers, http.StatusCreated)

	var tickets, ops, replays int64
	db.Raw(`SELECT count(*) FROM tickets WHERE project = 'replicas'`).Scan(&tickets)
	db.Raw(`SELECT count(*) FROM operations WHERE kind = 'tickets.create'`).Scan(&ops)
	db.Raw(`SELECT count(*) FROM operation_events WHERE type = 'replayed'`).Scan(&replays)
	if tickets != keys || ops != keys || replays != keys*(copies-1) {
		t.Fatalf("%d tickets, %d operations, %d replayed records; want %d, %d, %d", tickets, ops, replays, keys, keys, keys*(copies-1))
	}
	servicetest.AuditIntact(t, db.DB)
}
