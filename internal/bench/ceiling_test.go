package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
)

// TestCeilingsStoreEachKeyOnce: a ceiling is a bound only if it does what it claims, the least idempotency:
// copies of one request sent at once make one ticket and all get its answer, a retry gets the stored answer,
// and another body under the same key is refused without a write. The schema ceiling also records every
// attempt, as retrysafe does: the create's own record, one per copy and retry answered from the key, one for
// the refusal. Each on a database of its own, dropped after.
func TestCeilingsStoreEachKeyOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(ctx context.Context, databaseURL, addr string) error
		rows  map[string]int64
	}{
		{TargetCeiling, ServeCeiling, map[string]int64{
			"SELECT count(*) FROM tickets":      1,
			"SELECT count(*) FROM ceiling_keys": 1,
		}},
		{TargetSchemaCeiling, ServeSchemaCeiling, map[string]int64{
			"SELECT count(*) FROM tickets": 1,
			"SELECT count(*) FROM operations WHERE key_state = 'completed' AND resource_id = (SELECT id FROM tickets)": 1,
			"SELECT count(*) FROM operation_events WHERE type = 'completed'":                                           1,
			"SELECT count(*) FROM operation_events WHERE type = 'replayed'":                                            8,
			"SELECT count(*) FROM operation_events WHERE type = 'conflict_rejected'":                                   1,
			"SELECT count(*) FROM operation_events":                                                                    10,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ceilingStoresEachKeyOnce(t, tc.serve, tc.rows)
		})
	}
}

// ceilingStoresEachKeyOnce runs serve on a fresh database, sends it the requests above and checks each of rows
// (a count query) gives its count.
func ceilingStoresEachKeyOnce(t *testing.T, serve func(ctx context.Context, databaseURL, addr string) error, rows map[string]int64) {
	ctx := context.Background()
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path, u.RawQuery = "", ""
	srv := Server{Base: u.String()}
	name := fmt.Sprintf("bench_%s_test_%d", strings.ReplaceAll(path.Base(t.Name()), "-", "_"), os.Getpid())
	if err := srv.Fresh(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Drop(context.Background(), name) })
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- serve(sctx, srv.URL(name), addr) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	base := "http://" + addr
	for deadline := time.Now().Add(60 * time.Second); ; {
		if res, err := http.Get(base + "/healthz"); err == nil {
			res.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	post := func(body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/tickets", bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+agentSecret)
		req.Header.Set("Idempotency-Key", "k1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(raw)
	}
	const body = `{"project":"bench","title":"one"}`
	statuses, bodies := make([]int, 8), make([]string, 8)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Go(func() { statuses[i], bodies[i] = post(body) })
	}
	wg.Wait()
	for i := range statuses {
		if statuses[i] != http.StatusCreated || bodies[i] != bodies[0] {
			t.Fatalf("copy %d: %d %s; want 201 with the first's body %s", i, statuses[i], bodies[i], bodies[0])
		}
	}
	if status, got := post(body); status != http.StatusCreated || got != bodies[0] {
		t.Fatalf("retry: %d %s; want the stored answer %s", status, got, bodies[0])
	}
	if status, got := post(`{"project":"bench","title":"two"}`); status != http.StatusUnprocessableEntity {
		t.Fatalf("another body under the key: %d %s; want 422", status, got)
	}
	for query, want := range rows {
		if n, err := srv.Query1(ctx, name, query); err != nil || n != want {
			t.Errorf("%s: %d (%v); want %d", query, n, err, want)
		}
	}
}
