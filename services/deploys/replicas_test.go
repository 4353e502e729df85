package deploys_test

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// TestStatelessReplicas runs three `serve deploys` processes, controllers included, on one database and sends
// 20 deploy keys, four concurrent copies each, spread over the three; five keys aim at each of four
// environments. A copy refused with environment_locked (the key stays free), request_in_progress or
// store_unavailable sends the same key again, as an agent does. Nothing but the database decides: each key makes one deploy, the four
// copies of a key end with the same answer, byte for byte, every deploy settles, and the release lock held:
// at no moment did an environment have a queued or running deploy other than its lock holder, no two deploys
// of one environment ran at once, and no more deploys of the account ran at once than the cap all replicas
// share.
func TestStatelessReplicas(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	bin := proctest.Build(t)
	const maxRunning = 2
	env := map[string]string{
		"DATABASE_URL": db.DSN, "DB_MAX_CONNS": "4", "RATE_LIMIT_WRITES_PER_SECOND": "0",
		"DEPLOY_STEPS": "2", "DEPLOY_STEP_DURATION": "100ms", "DEPLOY_POLL_INTERVAL": "100ms",
		"DEPLOY_HEARTBEAT_INTERVAL": "500ms", "DEPLOY_LOCK_LEASE": "10s",
		"DEPLOY_MAX_RUNNING_PER_ACCOUNT": fmt.Sprint(maxRunning),
	}
	var clients []*apitest.Client
	for _, p := range proctest.StartReplicas(t, bin, 3, []string{"serve", "deploys"}, env, "DEPLOYS_ADDR") {
		clients = append(clients, apitest.New(t, p.URL, servicetest.AgentSecret))
	}

	// While the requests and the controllers run, a watcher checks in consistent snapshots that every queued or
	// running deploy holds its environment's lock (one holder per environment: never two at once).
	stop := make(chan struct{})
	var watcher sync.WaitGroup
	samples := 0
	watcher.Go(func() {
		for {
			var strays []string
			if err := db.Raw(`SELECT d.id FROM deploys d
LEFT JOIN environment_locks l ON l.account_id = d.account_id AND l.environment = d.environment
WHERE d.state IN ('queued', 'running') AND l.holder_deploy_id IS DISTINCT FROM d.id`).Scan(&strays).Error; err != nil {
				t.Errorf("watcher: %v", err)
				return
			}
			samples++
			if len(strays) > 0 {
				t.Errorf("deploys %v are queued or running without holding their environment's lock", strays)
				return // once is enough
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})

	const keys, copies = 20, 4
	environments := []string{"staging", "qa", "dev", "perf"}
	answers := apitest.Copies{Clients: clients, Requests: keys, Copies: copies,
		Send: func(c *apitest.Client, k int) (*apitest.Response, error) {
			body := deployBody("api", environments[k%len(environments)], artifact(k+1))
			return c.Try(http.MethodPost, "/v1/deploys", body, apitest.Key(fmt.Sprintf("deploy-%d", k)))
		},
		Again:   apitest.AgainOn("environment_locked", "request_in_progress", "store_unavailable"),
		MaxWait: 300 * time.Millisecond, Deadline: 2 * time.Minute,
	}.Run()
	apitest.AgreeOnce(t, answers, http.StatusAccepted)
	t.Logf("%d of %d copies were sent again after environment_locked or request_in_progress (or store_unavailable)", apitest.SentAgain(answers), keys*copies)

	// Every key made its own deploy, and every deploy settles (the controllers of the replicas run them).
	ids := map[string]bool{}
	for k, as := range answers {
		d := decodeDeploy(t, as[0].Res)
		if d.Environment != environments[k%len(environments)] || d.Artifact == nil || *d.Artifact != artifact(k+1) || ids[d.ID] {
			t.Fatalf("key %d answered %s", k, as[0].Res.Body)
		}
		ids[d.ID] = true
		if s := waitFinal(t, clients[k%len(clients)], d.ID); s.State != deploys.StateSucceeded {
			t.Fatalf("deploy %s of key %d settled %s; want succeeded", d.ID, k, s.State)
		}
	}
	close(stop)
	watcher.Wait()
	t.Logf("the lock watcher took %d snapshots", samples)

	if n := count(t, db.DB, `SELECT count(*) FROM deploys`); n != keys {
		t.Fatalf("%d deploys; want %d", n, keys)
	}
	if n := count(t, db.DB, `SELECT count(*) FROM operations WHERE kind = ?`, deploys.KindDeploy); n != keys {
		t.Fatalf("%d deploy operations; want %d", n, keys)
	}
	if n := count(t, db.DB, `SELECT count(*) FROM operation_events WHERE type = 'replayed'`); n != keys*(copies-1) {
		t.Fatalf("%d replayed records; want %d", n, keys*(copies-1))
	}
	// The target activated each deploy once.
	if n := count(t, db.DB, `SELECT count(*) FROM deploy_target_activations WHERE calls = 1`); n != keys {
		t.Fatalf("%d deploys activated exactly once at the target; want %d", n, keys)
	}

	// The stored rows: per environment, in start order, each deploy started after the one before finished, with
	// a newer fencing token, planned on the version the one before made; the environment ends at the last.
	type span struct {
		ID, Environment                  string
		FencingToken, EnvironmentVersion int64
		StartedAt, FinishedAt            time.Time
	}
	var rows []span
	if err := db.Raw(`SELECT id, environment, fencing_token, environment_version, started_at, finished_at
FROM deploys ORDER BY environment, started_at`).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		if i == 0 || rows[i-1].Environment != r.Environment {
			if r.EnvironmentVersion != 0 {
				t.Fatalf("first deploy of %s planned on version %d", r.Environment, r.EnvironmentVersion)
			}
			continue
		}
		prev := rows[i-1]
		if !r.StartedAt.After(prev.FinishedAt) || r.FencingToken <= prev.FencingToken || r.EnvironmentVersion != prev.EnvironmentVersion+1 {
			t.Fatalf("deploys of %s overlap or are out of order:\n%+v\n%+v", r.Environment, prev, r)
		}
	}
	for _, name := range environments {
		e := environment(t, clients[0], name)
		perEnv := int64(keys / len(environments))
		last := slices.IndexFunc(rows, func(r span) bool { return r.Environment == name && r.EnvironmentVersion == perEnv-1 })
		if e.Lock != nil || e.Version != perEnv || last < 0 || e.CurrentDeployID == nil || *e.CurrentDeployID != rows[last].ID {
			t.Fatalf("environment %s: %+v; want unlocked at version %d", name, e, perEnv)
		}
	}
	// Across environments, never more running at once than the account's cap.
	running, peak := 0, 0
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, r := range rows {
		edges = append(edges, edge{r.StartedAt, 1}, edge{r.FinishedAt, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	for _, e := range edges {
		if running += e.delta; running > maxRunning {
			t.Fatalf("%d deploys of one account ran at once at %s; the cap is %d", running, e.at, maxRunning)
		}
		peak = max(peak, running)
	}
	t.Logf("at most %d deploys ran at once (cap %d)", peak, maxRunning)
	servicetest.AuditIntact(t, db.DB)
}
