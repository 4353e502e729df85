package database_test

import (
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// TestMultiHostPoolMovesOn: a pool on a multi-host URL (what a failover setup gives the services, docs/failover.md)
// whose first host dies, every connection cut and new ones refused, keeps its process: each
// pooled connection fails at most once, with a store failure, and is dropped; new connections go to the next
// host.
func TestMultiHostPoolMovesOn(t *testing.T) {
	t.Parallel()
	first, second := proxy(t), proxy(t)
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = first.Addr() + "," + second.Addr()
	const conns = 4
	pool := open(t, u.String(), database.Options{MaxConns: conns, ConnectTimeout: time.Second,
		AcquireTimeout: time.Second, StatementTimeout: time.Second})

	// Fill the pool: every connection is to the first host.
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			if err := pool.DB.Exec(`SELECT pg_sleep(?)`, 0.2).Error; err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if first.Open() != conns || second.Accepted() != 0 {
		t.Fatalf("connections: %d open to the first host, %d accepted by the second; want %d, 0", first.Open(), second.Accepted(), conns)
	}

	first.Refuse(true)
	first.CutAll()
	failed := 0
	for range conns + 1 {
		err := pool.DB.Exec(`SELECT ?::int`, 1).Error
		if err == nil {
			break
		}
		if !problem.IsStoreUnavailable(err) {
			t.Fatalf("statement on a dead host: %v; want a store failure", err)
		}
		failed++
	}
	t.Logf("%d statements failed before one reached the second host", failed)
	if failed > conns || second.Accepted() == 0 {
		t.Fatalf("%d statements failed, %d connections to the second host; want at most one failure per pooled connection, then the second host", failed, second.Accepted())
	}
	for range 2 * conns {
		if err := pool.DB.Exec(`SELECT ?::int`, 1).Error; err != nil {
			t.Fatalf("after the move to the second host: %v", err)
		}
	}
}
