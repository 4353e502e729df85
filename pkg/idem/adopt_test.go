package idem_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// otherDriver is a database/sql driver that is not pgx: what an adopter has who opened gorm on lib/pq or
// another database. It never connects; New must refuse it before any request.
type otherDriver struct{}

func (otherDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("otherDriver never connects")
}

var registerOther sync.Once

// TestNewRefusesPoolsItCannotUse: New accepts the pool of gorm's postgres driver (default config) and of
// database.Open, and refuses, with a message naming what to pass, a transaction and a pool of another driver.
func TestNewRefusesPoolsItCannotUse(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t, servicetest.GormDefaults())
	for name, db := range map[string]*gorm.DB{"gorm defaults": env.ServiceDB, "database.Open": testdb.Schema(t).DB} {
		if h, err := idem.New(db); err != nil || h.DB != db {
			t.Errorf("%s: New = %v, %v; want a handler on it", name, h, err)
		}
	}
	tx := env.ServiceDB.Begin()
	defer tx.Rollback()
	registerOther.Do(func() { sql.Register("retrysafe-other", otherDriver{}) })
	sqlDB, err := sql.Open("retrysafe-other", "")
	if err != nil {
		t.Fatal(err)
	}
	other, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{DisableAutomaticPing: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		db   *gorm.DB
		want string
	}{
		"a transaction":  {tx, "pass the pool, not a transaction"},
		"another driver": {other, "needs PostgreSQL through pgx"},
		"no pool":        {nil, "no pool"},
	} {
		if _, err := idem.New(tc.db); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v; want an error saying %q", name, err, tc.want)
		}
	}
}

// outcomes counts the handler's outcomes, as package metrics would.
type outcomes struct {
	mu sync.Mutex
	n  map[idem.Outcome]int
}

func (o *outcomes) BackgroundRunning(bool)                      {}
func (o *outcomes) OperationFinished(string, opstatus.State)    {}
func (o *outcomes) Reconciled(string, opstatus.ReconcileResult) {}
func (o *outcomes) IdempotencyOutcome(_ string, out idem.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[out]++
}

// TestKeyOptional: with KeyOptional, a write without a key runs every time it is sent (two rows for two sends),
// says so in Idempotency-Key-Absent and is counted unkeyed; a write with a key is idempotent as always and
// carries no such header. Without KeyOptional a missing key is refused and writes nothing.
func TestKeyOptional(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t, servicetest.GormDefaults())
	if err := env.DB.Exec(`CREATE TABLE IF NOT EXISTS marks (id bigserial PRIMARY KEY, op text NOT NULL); DELETE FROM marks`).Error; err != nil {
		t.Fatal(err)
	}
	seen := &outcomes{n: map[idem.Outcome]int{}}
	optional := &idem.Handler{DB: env.ServiceDB, KeyOptional: true, Observer: seen}
	strict := &idem.Handler{DB: env.ServiceDB}
	serve := func(h *idem.Handler) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r = r.WithContext(idem.WithCaller(r.Context(), idem.Caller{AccountID: "acct_opt", Actor: "agent:opt"}))
			h.Handle(w, r, idem.Request{Kind: "marks.create", Command: map[string]any{}},
				func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
					return idem.Result{Status: http.StatusCreated, Body: map[string]string{"op": op.ID}},
						tx.Exec(`INSERT INTO marks (op) VALUES (?)`, op.ID).Error
				})
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	send := func(srv *httptest.Server, key string) answer {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/marks", strings.NewReader(`{}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: string(body)}
	}
	marks := func() (n int64) {
		env.DB.Raw(`SELECT count(*) FROM marks`).Scan(&n)
		return n
	}
	opt, str := serve(optional), serve(strict)
	for i := range 2 {
		if a := send(opt, ""); a.status != http.StatusCreated || a.header.Get("Idempotency-Key-Absent") != "true" {
			t.Fatalf("unkeyed send %d: %d %v %s; want 201 with %s", i, a.status, a.header, a.body, "Idempotency-Key-Absent")
		}
	}
	first, again := send(opt, "k1"), send(opt, "k1")
	if first.header.Get("Idempotency-Key-Absent") != "" || again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
		t.Fatalf("keyed sends: %v %s, then %v %s; want a replay and no %s", first.header, first.body, again.header, again.body, "Idempotency-Key-Absent")
	}
	if n := marks(); n != 3 {
		t.Fatalf("%d rows; want 3 (two unkeyed sends, one keyed)", n)
	}
	if seen.n[idem.Outcome("unkeyed")] != 2 || seen.n[idem.Outcome("created")] != 1 || seen.n[idem.Outcome("replayed")] != 1 {
		t.Fatalf("outcomes %v; want 2 unkeyed, 1 created, 1 replayed", seen.n)
	}
	if a := send(str, ""); a.status != http.StatusBadRequest || !strings.Contains(a.body, "idempotency_key_missing") || marks() != 3 {
		t.Fatalf("strict handler without a key: %d %s, %d rows; want 400 idempotency_key_missing and nothing written", a.status, a.body, marks())
	}
}

// TestRunBackground: a handler serving writes without its background work says so once, in its log and to its
// Observer; RunBackground then prunes (a response past a 1 ms retention is dropped, its key kept) and seals the
// audit (a checkpoint appears), and tells the Observer it runs until its context ends.
func TestRunBackground(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t, servicetest.GormDefaults())
	var logged strings.Builder
	var mu sync.Mutex
	running := []bool{}
	obs := &backgroundSeen{outcomes: outcomes{n: map[idem.Outcome]int{}}, seen: func(r bool) { mu.Lock(); running = append(running, r); mu.Unlock() }}
	h := &idem.Handler{DB: env.ServiceDB, Observer: obs, Retention: time.Millisecond, KeyLifetime: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logged}, nil))}
	call := func(key string) idem.Answer {
		return h.Run(context.Background(), idem.Call{Method: "POST", Route: "/v1/bg", Header: http.Header{"Idempotency-Key": {key}},
			Caller: idem.Caller{AccountID: "acct_bg", Actor: "agent:bg"}}, idem.Request{Kind: "bg.write", Command: map[string]any{}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				return idem.Result{Status: http.StatusCreated, Body: map[string]string{"op": op.ID}}, nil
			})
	}
	for _, k := range []string{"k1", "k2"} {
		if a := call(k); a.Err != nil || a.Status != http.StatusCreated {
			t.Fatalf("write %s: %+v", k, a)
		}
	}
	if n := strings.Count(logged.String(), "background work is not running"); n != 1 {
		t.Fatalf("log has the warning %d times; want once:\n%s", n, logged.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		h.RunBackground(ctx, idem.Background{PruneInterval: 20 * time.Millisecond, SealInterval: 20 * time.Millisecond})
		close(done)
	}()
	servicetest.Eventually(t, "the responses are pruned, the keys kept, and the audit sealed", func() bool {
		var expired, seals int64
		env.DB.Raw(`SELECT count(*) FROM operations WHERE account_id = 'acct_bg' AND key_state = 'expired'`).Scan(&expired)
		env.DB.Raw(`SELECT count(*) FROM audit_seals`).Scan(&seals)
		return expired == 2 && seals > 0
	})
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(running) != 3 || running[0] || !running[1] || running[2] {
		t.Fatalf("observer told %v; want [false true false]: not running at the first write, then started, then stopped", running)
	}
}

type backgroundSeen struct {
	outcomes
	seen func(bool)
}

func (b *backgroundSeen) BackgroundRunning(r bool) { b.seen(r) }

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
