package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// proxied is the bounds the fault tests give the service's pool: short, so a cut database fails fast.
var proxied = servicetest.ThroughProxy(database.Options{
	MaxConns: 4, ConnectTimeout: time.Second, AcquireTimeout: time.Second, StatementTimeout: 2 * time.Second,
})

// assertOutcomeUnknown checks the answer that must follow an effect that may have happened: 503
// outcome_unknown naming the operation, never store_unavailable ("nothing was done").
func assertOutcomeUnknown(t *testing.T, r reply) string {
	t.Helper()
	opID := r.header.Get("Operation-Id")
	if r.status != 503 || r.body["code"] != "outcome_unknown" || opID == "" || r.body["operation_id"] != opID ||
		r.body["state"] != "unknown" || r.header.Get("Retry-After") == "" {
		t.Fatalf("answer = %d %v %v; want 503 outcome_unknown naming the operation", r.status, r.header, r.body)
	}
	return opID
}

// TestRecordLostAfterEffect: the effect happens, then the database goes away before its outcome is recorded.
// The caller hears that the outcome is unknown and which operation it is; the claim stays (its lease runs), a
// same-key retry never runs the effect again, and once the database is back the operation settles from the
// other side's record and the key replays it.
func TestRecordLostAfterEffect(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 500*time.Millisecond, proxied)
	p := e.env.Proxy
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		p.Refuse(true)
		p.CutAll()
		return "charged", nil
	}
	opID := assertOutcomeUnknown(t, e.post(t, "k", `{"amount":5}`))

	var keyState, opState string
	e.env.DB.Raw(`SELECT key_state FROM operations WHERE idempotency_key = 'k' AND key_state IS NOT NULL`).Scan(&keyState)
	e.env.DB.Raw(`SELECT state FROM operations WHERE id = ?`, opID).Scan(&opState)
	if keyState != "running" || opState != "running" {
		t.Fatalf("key %q, operation %q; want the claim kept, running", keyState, opState)
	}

	// Still down: a retry cannot even read the key. It hears that this attempt changed nothing, and to retry
	// with the same key; it never runs the effect.
	if r := e.post(t, "k", `{"amount":5}`); r.status != 503 || r.body["code"] != "store_unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("retry while down: %d %v", r.status, r.body)
	}
	p.Refuse(false)
	if r := e.post(t, "k", `{"amount":5}`); r.body["operation_id"] != opID {
		t.Fatalf("retry after the outage: %d %v; want an answer about %s", r.status, r.body, opID)
	}

	worker := &opstatus.RecoveryWorker{DB: e.env.DB.Pool, Logger: e.env.Logger, Reconcilers: map[string]opstatus.Reconciler{
		"test.charge": opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
			return e.env.Idem.Settle(ctx, op, "system:test", func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
				return idem.Result{Status: 200, Body: map[string]any{"operation": op.ID, "outcome": "found at the other side"}}, nil
			})
		}),
	}}
	servicetest.Eventually(t, "the lease runs out and the operation settles", func() bool {
		n, err := worker.RunOnce(context.Background())
		return err == nil && n == 1
	})
	r := e.post(t, "k", `{"amount":5}`)
	if r.status != 200 || r.body["operation"] != opID || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after settling: %d %v", r.status, r.body)
	}
	if n := e.effect.calls.Load(); n != 1 {
		t.Fatalf("effect ran %d times; want 1", n)
	}
}

// TestLostAnswerWhileStoreDown: the effect's answer is lost and the database is gone as well, so the operation
// can be neither marked unknown nor read: the answer still names it and says the outcome is unknown.
func TestLostAnswerWhileStoreDown(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 5*time.Second, proxied)
	p := e.env.Proxy
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		p.Refuse(true)
		p.CutAll()
		return "", fmt.Errorf("read: connection reset: %w", idem.ErrOutcomeUnknown)
	}
	opID := assertOutcomeUnknown(t, e.post(t, "k", `{"amount":5}`))
	var opState string
	e.env.DB.Raw(`SELECT state FROM operations WHERE id = ?`, opID).Scan(&opState)
	if opState != "running" || e.effect.calls.Load() != 1 {
		t.Fatalf("operation %q, effect ran %d times; want running (left to the recovery worker), once", opState, e.effect.calls.Load())
	}
}

// TestConnectionLostUnderWaitingWrite is issue 8's second finding: a local write's statement is waiting when
// the database restarts (the connection drops: unexpected EOF). The answer is 503 store_unavailable with
// Retry-After, not 500, nothing is stored, and the same key then succeeds once.
func TestConnectionLostUnderWaitingWrite(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t, proxied)
	marker := fmt.Sprintf("waiting_write_%d", time.Now().UnixNano())
	var slow atomic.Bool
	slow.Store(true)
	var writes atomic.Int64
	notes := func(c *gin.Context) {
		idemgin.Do(env.Idem, c, idem.Request{Kind: "test.note", Command: map[string]any{"n": 1}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				if slow.Load() {
					if err := tx.Exec(`SELECT pg_sleep(?) -- `+marker, 30).Error; err != nil {
						return idem.Result{}, err
					}
				}
				writes.Add(1)
				return idem.Result{Status: 201, Body: map[string]any{"operation": op.ID}}, nil
			})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/notes", notes) }))

	answer := make(chan reply, 1)
	go func() { answer <- postJSON(t, env.URL+"/notes", "n-1", `{}`) }()
	servicetest.Eventually(t, "the write waits in the database", func() bool {
		var n int64
		env.DB.Raw(`SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%' || ? `, marker).Scan(&n)
		return n == 1
	})
	env.Proxy.CutAll()
	if r := <-answer; r.status != 503 || r.body["code"] != "store_unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("answer = %d %v %v; want store_unavailable with Retry-After", r.status, r.body, r.header)
	}
	env.DB.Exec(`SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE '%' || ? AND pid <> pg_backend_pid()`, marker)
	var keys int64
	env.DB.Raw(`SELECT count(*) FROM operations WHERE key_state IS NOT NULL`).Scan(&keys)
	if keys != 0 || writes.Load() != 0 {
		t.Fatalf("%d keys, %d writes after the lost connection; want none", keys, writes.Load())
	}

	slow.Store(false)
	first, again := postJSON(t, env.URL+"/notes", "n-1", `{}`), postJSON(t, env.URL+"/notes", "n-1", `{}`)
	if first.status != 201 || again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || writes.Load() != 1 {
		t.Fatalf("after the outage: %d, %d, %d writes; want 201 once and its replay", first.status, again.status, writes.Load())
	}
}

// TestCallerHangsUpDuringClaim is issue 8's sixth finding: the caller disconnects while the claim commits (the
// COMMIT has left, its answer has not come back). The claim still commits and the server finishes the
// operation, so a retry with the same key gets the first attempt's answer and the effect ran once; before, the
// handler gave up with "context canceled" and the operation stayed claimed and never ran.
func TestCallerHangsUpDuringClaim(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 5*time.Second, proxied)
	p := e.env.Proxy
	hungUp := make(chan struct{})
	clientCtx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	unset := failpoint.Set("idem.external.claimed", func(detail any) {
		if op, ok := detail.(opstatus.Operation); !ok || op.IdempotencyKey != "hangup" {
			return
		}
		p.Stall(true)
		go func() {
			defer close(hungUp)
			servicetest.Eventually(t, "the COMMIT leaves the service", func() bool { return p.Held() > 0 })
			hangUp()
			servicetest.Eventually(t, "the server sees the caller gone", func() bool {
				ctx, ok := e.requests.Load("hangup")
				return ok && ctx.(context.Context).Err() != nil
			})
			p.Stall(false)
		}()
	})
	defer unset()

	req, _ := http.NewRequestWithContext(clientCtx, http.MethodPost, e.url+"/charges", strings.NewReader(`{"amount":5}`))
	req.Header.Set("Authorization", "Bearer "+servicetest.AgentSecret)
	req.Header.Set("Idempotency-Key", "hangup")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the first attempt got an answer (%d); the test meant to hang up before it", resp.StatusCode)
	}
	<-hungUp

	var first string
	servicetest.Eventually(t, "the operation settles without its caller", func() bool {
		e.env.DB.Raw(`SELECT state FROM operations WHERE idempotency_key = 'hangup' AND key_state = 'completed'`).Scan(&first)
		return first != ""
	})
	retry := e.post(t, "hangup", `{"amount":5}`)
	if first != "succeeded" || retry.status != 200 || retry.body["outcome"] != "charged" || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("operation %q; retry %d %v; want the first attempt's stored answer", first, retry.status, retry.body)
	}
	if n := e.effect.calls.Load(); n != 1 {
		t.Fatalf("effect ran %d times; want 1", n)
	}
}

// TestLeaseCountsFromClaimCommit is issue 8's fourth finding: the claim waits on a lock for most of the lease
// (another transaction holds what Prepare reserves). The effect still gets its whole lease, counted from the
// claim's commit, and is sent once.
func TestLeaseCountsFromClaimCommit(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	e := setupExternal(t, lease)
	lockID := time.Now().UnixNano()
	e.effect.prepare = func(ctx context.Context, tx *gorm.DB) error {
		return tx.Exec(`SELECT pg_advisory_xact_lock(?)`, lockID).Error
	}
	var leftAtCall atomic.Int64
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		leftAtCall.Store(int64(op.LeaseExpiresAt.Sub(e.env.Clock.Now())))
		return "charged", nil
	}
	holder := e.env.DB.Begin()
	if err := holder.Exec(`SELECT pg_advisory_xact_lock(?)`, lockID).Error; err != nil {
		t.Fatal(err)
	}
	answer := make(chan reply, 1)
	go func() { answer <- e.post(t, "waited", `{"amount":5}`) }()
	servicetest.Eventually(t, "the claim waits on the lock", func() bool {
		var n int64
		e.env.DB.Raw(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = (?::bigint & 4294967295)::oid`, lockID).Scan(&n)
		return n == 1
	})
	e.env.Clock.Advance(lease * 6 / 10) // most of the lease goes by while the claim waits
	holder.Rollback()

	r := <-answer
	if r.status != 200 || e.effect.calls.Load() != 1 {
		t.Fatalf("answer %d %v, effect ran %d times; want 200, once", r.status, r.body, e.effect.calls.Load())
	}
	if left := time.Duration(leftAtCall.Load()); left < lease*3/4 {
		t.Fatalf("the effect started with %s of its %s lease; the lease must count from the claim's commit", left, lease)
	}
}

// TestUnsentWhenLeaseSpentAtCommit: the claim's COMMIT itself takes most of the lease. The effect is not sent
// (it could outlive its lease and be judged by the recovery worker while in flight); the claim is released with
// a not_sent event, the caller hears that nothing was sent, and the same key then runs the effect once.
func TestUnsentWhenLeaseSpentAtCommit(t *testing.T) {
	t.Parallel()
	const lease = 4 * time.Second
	e := setupExternal(t, lease, proxied)
	var slowed atomic.Bool
	unset := failpoint.Set("idem.external.claimed", func(detail any) {
		if op, ok := detail.(opstatus.Operation); ok && op.IdempotencyKey == "slow-commit" && slowed.CompareAndSwap(false, true) {
			// The first claim's commit is slow: less than the dispatch margin (a quarter of the lease) is left
			// after it.
			e.env.Clock.Advance(lease * 8 / 10)
		}
	})
	defer unset()

	r := e.post(t, "slow-commit", `{"amount":5}`)
	if r.status != 503 || r.body["code"] != "store_unavailable" || e.effect.calls.Load() != 0 {
		t.Fatalf("answer %d %v, effect ran %d times; want 503 store_unavailable, not sent", r.status, r.body, e.effect.calls.Load())
	}
	var released struct {
		Keys    int64
		State   string
		NotSent int64
	}
	e.env.DB.Raw(`SELECT (SELECT count(*) FROM operations WHERE key_state IS NOT NULL) AS keys,
       (SELECT state FROM operations WHERE idempotency_key = 'slow-commit') AS state,
       (SELECT count(*) FROM operation_events WHERE type = 'not_sent') AS not_sent`).Scan(&released)
	if released.Keys != 0 || released.State != "cancelled" || released.NotSent != 1 {
		t.Fatalf("after the refusal: %+v; want the key free, the operation cancelled with a not_sent event", released)
	}

	again := e.post(t, "slow-commit", `{"amount":5}`)
	if again.status != 200 || again.body["outcome"] != "charged" || e.effect.calls.Load() != 1 {
		t.Fatalf("same-key retry: %d %v, effect ran %d times; want 200, once", again.status, again.body, e.effect.calls.Load())
	}
}

// TestFrozenDatabaseAnswers503 is issue 8's fifth finding: with the database frozen a write does not hang until
// the caller gives up; it answers 503 store_unavailable with Retry-After once the statement bound runs out,
// stores nothing, and the same key works after the thaw.
func TestFrozenDatabaseAnswers503(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t, servicetest.ThroughProxy(database.Options{
		MaxConns: 2, ConnectTimeout: 500 * time.Millisecond, AcquireTimeout: 500 * time.Millisecond, StatementTimeout: 500 * time.Millisecond,
	}))
	var writes atomic.Int64
	notes := func(c *gin.Context) {
		idemgin.Do(env.Idem, c, idem.Request{Kind: "test.note", Command: map[string]any{"n": 1}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				writes.Add(1)
				return idem.Result{Status: 201, Body: map[string]any{"operation": op.ID}}, nil
			})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/notes", notes) }))

	env.Proxy.Stall(true)
	r := postJSON(t, env.URL+"/notes", "frozen", `{}`)
	if r.status != 503 || r.body["code"] != "store_unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("write while frozen: %d %v %v; want 503 store_unavailable with Retry-After", r.status, r.body, r.header)
	}
	env.Proxy.Stall(false)
	var keys int64
	env.DB.Raw(`SELECT count(*) FROM operations WHERE key_state IS NOT NULL`).Scan(&keys)
	if keys != 0 || writes.Load() != 0 {
		t.Fatalf("%d keys, %d writes after the frozen attempt; want none", keys, writes.Load())
	}
	first := postJSON(t, env.URL+"/notes", "frozen", `{}`)
	if first.status != 201 || writes.Load() != 1 {
		t.Fatalf("after the thaw: %d %v, %d writes", first.status, first.body, writes.Load())
	}
}

// TestLocalCommitLostIsOutcomeUnknown: a local write's COMMIT leaves and its answer never comes back (the
// database freezes). The write may have committed, so the answer is outcome_unknown naming the operation; here
// it did commit once the database thawed, and the same key replays it: a new key would have written twice.
func TestLocalCommitLostIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t, servicetest.ThroughProxy(database.Options{
		MaxConns: 2, ConnectTimeout: 500 * time.Millisecond, AcquireTimeout: 500 * time.Millisecond, StatementTimeout: 500 * time.Millisecond,
	}))
	var writes atomic.Int64
	notes := func(c *gin.Context) {
		idemgin.Do(env.Idem, c, idem.Request{Kind: "test.note", Command: map[string]any{"n": 1}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				if err := tx.Exec(`CREATE TABLE IF NOT EXISTS notes (id text PRIMARY KEY)`).Error; err != nil {
					return idem.Result{}, err
				}
				if err := tx.Exec(`INSERT INTO notes VALUES (?)`, op.ID).Error; err != nil {
					return idem.Result{}, err
				}
				writes.Add(1)
				return idem.Result{Status: 201, Body: map[string]any{"operation": op.ID}}, nil
			})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/notes", notes) }))
	var stalled atomic.Bool
	unset := failpoint.Set("idem.before_commit", func(detail any) {
		if op, ok := detail.(opstatus.Operation); ok && op.IdempotencyKey == "commit-lost" && stalled.CompareAndSwap(false, true) {
			env.Proxy.Stall(true) // the COMMIT reaches the database only after the thaw; its answer never comes back
		}
	})
	defer unset()

	opID := assertOutcomeUnknown(t, postJSON(t, env.URL+"/notes", "commit-lost", `{}`))
	// After the thaw the held COMMIT reaches the database, unless the driver's cancel request (sent when its
	// deadline passed, and held by the same stall) reaches it first and the transaction rolls back. The server
	// could not know which, which is why it answered outcome_unknown; either way a same-key retry must leave
	// exactly one note: the committed one replayed, or the write done now.
	env.Proxy.Stall(false)
	servicetest.Eventually(t, "the proxy forwards what it held", func() bool { return env.Proxy.Held() == 0 })
	// The held COMMIT may still hold the key for a moment after the thaw: the retry's claim then waits out its
	// statement timeout and is told 503 store_unavailable, "this attempt changed nothing; retry with the same
	// key", which is what a client does.
	var again reply
	servicetest.Eventually(t, "a same-key retry answered other than 503", func() bool {
		again = postJSON(t, env.URL+"/notes", "commit-lost", `{}`)
		return again.status != 503
	})
	var rows int64
	env.DB.Raw(`SELECT count(*) FROM notes`).Scan(&rows)
	replayed := again.header.Get("Idempotent-Replayed") == "true"
	if again.status != 201 || rows != 1 || (replayed && again.body["operation"] != opID) {
		t.Fatalf("same-key retry: %d %v (replayed %v), %d notes; want one note: %s replayed, or written once now",
			again.status, again.body, replayed, rows, opID)
	}
	var ops int64
	env.DB.Raw(`SELECT count(*) FROM operations WHERE idempotency_key = 'commit-lost'`).Scan(&ops)
	if ops != 1 {
		t.Fatalf("%d operations for the key; want 1", ops)
	}
}
