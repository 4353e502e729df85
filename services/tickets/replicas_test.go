package tickets_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/idem"
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
	for range 3 {
		p := proctest.Start(t, bin, []string{"serve", "tickets"}, env, "TICKETS_ADDR")
		clients = append(clients, apitest.New(t, p.URL, servicetest.AgentSecret))
	}

	const keys, copies = 50, 6
	type answer struct {
		code     int
		replayed bool
		body     []byte
		err      error
	}
	answers := make([][copies]answer, keys)
	var wg sync.WaitGroup
	for k := range keys {
		body := fmt.Sprintf(`{"project":"replicas","title":"key %d","priority":"normal"}`, k)
		for i := range copies {
			c := clients[(k+i)%len(clients)]
			wg.Go(func() {
				res, err := c.Try(http.MethodPost, "/v1/tickets", body, apitest.Key(fmt.Sprintf("replica-%d", k)))
				if err != nil {
					answers[k][i] = answer{err: err}
					return
				}
				answers[k][i] = answer{code: res.Code, replayed: res.Header.Get(idem.HeaderReplayed) == "true", body: res.Body}
			})
		}
	}
	wg.Wait()

	for k, as := range answers {
		fresh := 0
		for i, a := range as {
			if a.err != nil || a.code != http.StatusCreated {
				t.Fatalf("key %d copy %d: %d %v %s; want 201", k, i, a.code, a.err, a.body)
			}
			if !bytes.Equal(a.body, as[0].body) {
				t.Fatalf("key %d: copies answered differently:\n%s\n%s", k, as[0].body, a.body)
			}
			if !a.replayed {
				fresh++
			}
		}
		if fresh != 1 {
			t.Errorf("key %d: %d answers were not replays; want exactly 1", k, fresh)
		}
	}
	var tickets, ops, replays int64
	db.Raw(`SELECT count(*) FROM tickets WHERE project = 'replicas'`).Scan(&tickets)
	db.Raw(`SELECT count(*) FROM operations WHERE kind = 'tickets.create'`).Scan(&ops)
	db.Raw(`SELECT count(*) FROM operation_events WHERE type = 'replayed'`).Scan(&replays)
	if tickets != keys || ops != keys || replays != keys*(copies-1) {
		t.Fatalf("%d tickets, %d operations, %d replayed records; want %d, %d, %d", tickets, ops, replays, keys, keys, keys*(copies-1))
	}
	rep, err := audit.Verify(context.Background(), db.DB, audit.VerifyOptions{})
	if err != nil || !rep.Intact() {
		t.Fatalf("audit verify: %v %v", rep.Problems, err)
	}
}
