package idem_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// TestLocalCopyWaitsForTheKeyAndReplays: two copies of one local write race. The first holds its claim (its key's
// lock) and its note uncommitted; the second, which found no key, waits for that lock. When the first commits, the
// second reads the key under the lock and finds it completed, so its note never runs (not even to be rolled back:
// the write's code counts it), and the second answers with the first's result as a replay, recorded as such.
func TestLocalCopyWaitsForTheKeyAndReplays(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	if err := env.DB.Exec(`CREATE TABLE IF NOT EXISTS notes (id text PRIMARY KEY)`).Error; err != nil {
		t.Fatal(err)
	}
	var (
		notesWritten atomic.Int64
		firstPID     atomic.Int64
		hold         = make(chan struct{})
	)
	notes := func(c *gin.Context) {
		idemgin.Do(env.Idem, c, idem.Request{Kind: "test.note", Command: map[string]any{"n": 1}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				var rows []struct{ ID string }
				if err := tx.WithContext(ctx).Raw(`INSERT INTO notes VALUES (?) RETURNING id`, op.ID).Scan(&rows).Error; err != nil {
					return idem.Result{}, err
				}
				if notesWritten.Add(1) == 1 {
					var pid int64
					if err := tx.Raw(`SELECT pg_backend_pid()`).Scan(&pid).Error; err != nil {
						return idem.Result{}, err
					}
					firstPID.Store(pid)
					<-hold // the first copy keeps its claim uncommitted until the second waits on it
				}
				return idem.Result{Status: http.StatusCreated, Body: map[string]any{"note": rows[0].ID}}, nil
			})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/notes", notes) }))

	a, b := race(t, env.DB.DB, env.URL+"/notes", `{"n":1}`, &firstPID, hold)
	if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first copy: %d %v %s; want a fresh 201", a.status, a.header, a.body)
	}
	if b.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "true" || b.body != a.body ||
		b.header.Get("Operation-Id") != a.header.Get("Operation-Id") {
		t.Fatalf("second copy: %d %v %s; want the first's answer replayed: %s", b.status, b.header, b.body, a.body)
	}
	var notesStored, keys, ops, replays int64
	env.DB.Raw(`SELECT count(*) FROM notes`).Scan(&notesStored)
	env.DB.Raw(`SELECT count(*) FROM operations WHERE idempotency_key = 'race' AND key_state IS NOT NULL`).Scan(&keys)
	env.DB.Raw(`SELECT count(*) FROM operations WHERE idempotency_key = 'race'`).Scan(&ops)
	env.DB.Raw(`SELECT count(*) FROM operation_events WHERE type = ?`, opstore.EventReplayed).Scan(&replays)
	if n := notesWritten.Load(); n != 1 || notesStored != 1 || keys != 1 || ops != 1 || replays != 1 {
		t.Fatalf("notes written %d, stored %d; keys %d, operations %d, replay records %d; want 1 of each", n, notesStored, keys, ops, replays)
	}
	var stored string
	env.DB.Raw(`SELECT id FROM notes`).Scan(&stored)
	var body map[string]string
	if err := json.Unmarshal([]byte(a.body), &body); err != nil || body["note"] != stored {
		t.Fatalf("answer %s names note %q; the stored one is %q", a.body, body["note"], stored)
	}
}

// race sends two copies of one request under the key "race": the first, whose handler stores its backend's
// pid in firstPID and then blocks on hold with its claim uncommitted; then the second, once the first holds.
// When the second's claim waits on a lock the first holds (pg_locks), it lets the first go, and returns both
// answers, the first's first.
func race(t *testing.T, db *gorm.DB, url, body string, firstPID *atomic.Int64, hold chan struct{}) (answer, answer) {
	t.Helper()
	first, second := make(chan answer, 1), make(chan answer, 1)
	go func() { first <- post(url, "race", body) }()
	servicetest.Eventually(t, "the first copy holds the key", func() bool { return firstPID.Load() != 0 })
	go func() { second <- post(url, "race", body) }()
	servicetest.Eventually(t, "the second copy's claim waits for the first's transaction", func() bool {
		// A lock the first holds and another backend waits for: its key's (local) or its transaction's (external).
		var waiting int64
		db.Raw(`SELECT count(*) FROM pg_locks w JOIN pg_locks h ON h.pid = ? AND h.granted AND h.locktype = w.locktype
  AND h.database IS NOT DISTINCT FROM w.database AND h.transactionid IS NOT DISTINCT FROM w.transactionid
  AND h.classid IS NOT DISTINCT FROM w.classid AND h.objid IS NOT DISTINCT FROM w.objid AND h.objsubid IS NOT DISTINCT FROM w.objsubid
WHERE NOT w.granted AND w.locktype IN ('advisory', 'transactionid')`, firstPID.Load()).Scan(&waiting)
		return waiting == 1
	})
	close(hold)
	a, b := <-first, <-second
	if a.err != nil || b.err != nil {
		t.Fatalf("answers: %v, %v", a.err, b.err)
	}
	return a, b
}

// answer is a reply read without failing the test, for requests sent from other goroutines.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

func post(url, key, body string) answer { return send(url, key, body, nil) }

// TestExternalClaimSentWithPrepareLosesCleanly: an external claim (key, operation and claimed event) goes with
// Prepare's first statement. The first copy holds its claim and its reservation uncommitted; the second, which
// found no key, sends its claim with its reservation and waits on the first's key. Once the first commits, the
// second's claim fails, its reservation never runs, and it answers from the stored key; the effect ran once and
// there is one operation.
func TestExternalClaimSentWithPrepareLosesCleanly(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 5*time.Second)
	if err := e.env.DB.Exec(`CREATE TABLE IF NOT EXISTS reservations (operation_id text PRIMARY KEY)`).Error; err != nil {
		t.Fatal(err)
	}
	var (
		reserved atomic.Int64
		firstPID atomic.Int64
		hold     = make(chan struct{})
	)
	e.effect.prepare = func(ctx context.Context, tx *gorm.DB) error {
		var pid []int64
		if err := tx.Raw(`INSERT INTO reservations SELECT id FROM operations WHERE idempotency_key = 'race' AND state = 'running'
RETURNING pg_backend_pid()`).Scan(&pid).Error; err != nil {
			return err
		}
		if reserved.Add(1) == 1 {
			firstPID.Store(pid[0])
			<-hold
		}
		return nil
	}
	a, b := race(t, e.env.DB.DB, e.url+"/charges", `{"amount":5}`, &firstPID, hold)
	if a.status != http.StatusOK || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first copy: %d %s; want a fresh 200", a.status, a.body)
	}
	// The second copy read the key while the first's effect was out (409 request_in_progress) or after it was
	// recorded (the stored answer, replayed): both name the first's operation.
	opID := a.header.Get("Operation-Id")
	switch {
	case b.status == http.StatusOK && b.header.Get("Idempotent-Replayed") == "true" && b.body == a.body:
	case b.status == http.StatusConflict && strings.Contains(b.body, `"request_in_progress"`) && strings.Contains(b.body, opID):
	default:
		t.Fatalf("second copy: %d %v %s; want the first's answer replayed, or request_in_progress naming %s", b.status, b.header, b.body, opID)
	}
	var reservations, keys, ops int64
	e.env.DB.Raw(`SELECT count(*) FROM reservations`).Scan(&reservations)
	e.env.DB.Raw(`SELECT count(*) FROM operations WHERE idempotency_key = 'race' AND key_state IS NOT NULL`).Scan(&keys)
	e.env.DB.Raw(`SELECT count(*) FROM operations WHERE idempotency_key = 'race'`).Scan(&ops)
	if n := reserved.Load(); n != 1 || reservations != 1 || keys != 1 || ops != 1 || e.effect.calls.Load() != 1 {
		t.Fatalf("reservations made %d, stored %d; keys %d, operations %d, effect calls %d; want 1 of each",
			n, reservations, keys, ops, e.effect.calls.Load())
	}
}
