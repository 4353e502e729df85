package conformancetest_test

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/conformance"
)

// TestTicketsWorkerKilled checks case 7 against a real tickets process: it runs with the failpoint
// idem.after_claim=pause, and the kill hook waits until the worker holds the claim, SIGKILLs it and starts a new
// process on the same schema. A front proxy owned by the test gives both processes one address, as a load
// balancer would. Retries with the same key must settle into one ticket.
func TestTicketsWorkerKilled(t *testing.T) {
	bin := proctest.Build(t)
	db := testdb.Schema(t)
	env := map[string]string{"DATABASE_URL": db.DSN, "MIGRATE_ON_START": "false", "RETRYSAFE_FAILPOINTS": "idem.after_claim=pause"}
	first := proctest.Start(t, bin, []string{"serve", "tickets"}, env, "TICKETS_ADDR")

	var backend atomic.Pointer[url.URL]
	setBackend := func(raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		backend.Store(u)
	}
	setBackend(first.URL)
	front := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:  func(pr *httputil.ProxyRequest) { pr.SetURL(backend.Load()) },
		ErrorLog: log.New(io.Discard, "", 0), // the killed worker's connection error is expected
	})
	t.Cleanup(front.Close)

	hook := func(ctx context.Context) error {
		first.WaitFor(t, "failpoint idem.after_claim reached")
		first.Kill(t)
		delete(env, "RETRYSAFE_FAILPOINTS")
		second := proctest.Start(t, bin, []string{"serve", "tickets"}, env, "TICKETS_ADDR")
		setBackend(second.URL)
		return nil
	}
	spec, err := conformance.LoadSpec("../../examples/conformance/tickets.json")
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"RETRYSAFE_TOKEN": servicetest.AgentSecret}
	rep := run(t, spec, conformance.Options{
		Target: front.URL, Getenv: func(name string) string { return secrets[name] },
		Cases: []int{conformance.CaseKilledWorker}, KillHook: hook,
	}, secrets)
	if got := rep.Verdicts(); len(got) != 1 || got[conformance.CaseKilledWorker] != conformance.Pass {
		t.Errorf("verdicts %v; want case 7 pass", got)
	}
	var tickets int64
	if err := db.Table("tickets").Count(&tickets).Error; err != nil {
		t.Fatal(err)
	}
	if tickets != 1 {
		t.Errorf("%d tickets in the schema; want 1", tickets)
	}
}
