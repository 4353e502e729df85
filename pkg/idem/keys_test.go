package idem

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/jackc/pgx/v5"
	"github.com/retrysafe/retrysafe/internal/poll"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// The key store's own tests: the statements and the transaction production runs (Handler.claim, completion and
// prune on database.Tx), below the HTTP layer the other tests go through.

// newAttempt is an external attempt: its claim inserts its operation, which its completion moves in place.
func newAttempt(account, key, fp string) *attempt {
	return &attempt{key: key, fingerprint: fp, caller: Caller{AccountID: account, Actor: "test"}, external: true,
		op: opstatus.Operation{ID: opstatus.NewID(), AccountID: account, Kind: "test", State: opstatus.StateRunning,
			IdempotencyKey: key, Fingerprint: fp}}
}

// claimed claims a's key with its operation and commits, as external mode does.
func claimed(t *testing.T, h *Handler, a *attempt) {
	t.Helper()
	ctx := context.Background()
	tx, err := database.Begin(ctx, h.DB)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if err := h.claim(ctx, tx, a, Request{}); err != nil {
		t.Fatalf("claim %s/%s: %v", a.op.AccountID, a.key, err)
	}
	if err := tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// completed stores a response for a's key and moves its operation to state, as a recorded outcome does.
func completed(t *testing.T, h *Handler, a *attempt, state opstatus.State) {
	t.Helper()
	ctx := context.Background()
	tx, err := database.Begin(ctx, h.DB)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	_, b, err := h.completion(a, Result{Status: 200, Body: map[string]any{}, State: state}, opstore.EventCompleted)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx, b); err != nil {
		t.Fatalf("complete %s: %v", a.key, err)
	}
}

// TestKeysAreScopedToAccounts: one key name in two accounts is two claims, each read back with its own
// operation; a key of one account is not found for another.
func TestKeysAreScopedToAccounts(t *testing.T) {
	t.Parallel()
	h := &Handler{DB: testdb.Schema(t).DB}
	a, b := newAttempt("acct-a", "shared", "fp-a"), newAttempt("acct-b", "shared", "fp-b")
	claimed(t, h, a)
	claimed(t, h, b)
	got, err := lookupKeys(context.Background(), h.DB, []keyRef{{"acct-b", "shared"}, {"acct-a", "shared"}, {"acct-c", "shared"}})
	if err != nil {
		t.Fatal(err)
	}
	if !got[0].found || got[0].operationID != b.op.ID || got[0].fingerprint != "fp-b" ||
		!got[1].found || got[1].operationID != a.op.ID || got[2].found {
		t.Fatalf("lookups %+v; want each account's own claim, and none for acct-c", got)
	}
}

// TestCompletionFailsBeforeCommit: the completion is sent with its COMMIT without waiting for its answer. An
// external completion for an operation other than the one that claimed the key stores nothing, fails with
// ErrAlreadySettled, and the COMMIT sent behind it never applies: nothing of the transaction is kept, the claim
// included. The right completion commits the operation holding its key, its claimed event and its outcome's.
func TestCompletionFailsBeforeCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Schema(t).DB
	h := &Handler{DB: db}
	for _, tc := range []struct {
		name         string
		other        bool
		ops, records int64
	}{{"another operation", true, 0, 0}, {"its operation", false, 1, 2}} {
		a := newAttempt("acct", "k", "fp")
		tx, err := database.Begin(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.claim(ctx, tx, a, Request{}); err != nil {
			t.Fatal(err)
		}
		if tc.other {
			a.op.ID = opstatus.NewID()
		}
		_, b, err := h.completion(a, Result{Status: 201, Body: map[string]any{}}, opstore.EventCompleted)
		if err != nil {
			t.Fatal(err)
		}
		err = tx.Commit(ctx, b)
		tx.Close()
		if (err == nil) != (tc.ops == 1) || (tc.other && !errors.Is(err, ErrAlreadySettled)) {
			t.Fatalf("%s: commit = %v", tc.name, err)
		}
		if ops, records := count(t, db, "operations"), count(t, db, "operation_events"); ops != tc.ops || records != tc.records {
			t.Fatalf("%s: %d operations, %d records; want %d and %d", tc.name, ops, records, tc.ops, tc.records)
		}
	}
}

// TestLocalOperationIsWrittenOnce: a local claim writes nothing (it takes its key's lock and reads the key); its
// completion inserts the operation completed, holding its key with the response, and its one record, and updates
// no row. When an external claim took the key between the local claim's read and its completion, the completion
// fails on the key (keyTaken) and nothing of the transaction is kept, its write included.
func TestLocalOperationIsWrittenOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Schema(t).DB
	h := &Handler{DB: db}
	if err := db.Exec(`CREATE TABLE IF NOT EXISTS written_once (id text PRIMARY KEY)`).Error; err != nil {
		t.Fatal(err)
	}
	const counters = `SELECT pg_stat_get_xact_tuples_inserted('operations'::regclass), pg_stat_get_xact_tuples_updated('operations'::regclass)`
	for _, tc := range []struct {
		name  string
		taken bool
	}{{"key free", false}, {"key taken meanwhile", true}} {
		key := strings.ReplaceAll(tc.name, " ", "-")
		a := newAttempt("acct", key, "fp")
		a.external = false
		tx, err := database.Begin(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		var inserted0, updated0, inserted, updated int64
		b := &pgx.Batch{}
		b.Queue(counters).QueryRow(func(row pgx.Row) error { return row.Scan(&inserted0, &updated0) })
		if err := tx.Send(ctx, b); err != nil {
			t.Fatal(err)
		}
		if err := h.claim(ctx, tx, a, Request{}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Gorm().Exec(`INSERT INTO written_once VALUES (?)`, key).Error; err != nil {
			t.Fatal(err)
		}
		if tc.taken {
			claimed(t, h, newAttempt("acct", key, "fp"))
		}
		_, b, err = h.completion(a, Result{Status: 201, Body: map[string]any{}}, opstore.EventCompleted)
		if err != nil {
			t.Fatal(err)
		}
		b.Queue(counters).QueryRow(func(row pgx.Row) error { return row.Scan(&inserted, &updated) })
		err = tx.Commit(ctx, b)
		tx.Close()
		if tc.taken {
			var notes int64
			db.Raw(`SELECT count(*) FROM written_once WHERE id = ?`, key).Scan(&notes)
			if !keyTaken(err) || notes != 0 {
				t.Fatalf("%s: commit = %v, %d notes; want the key taken and no note", tc.name, err, notes)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if inserted-inserted0 != 1 || updated-updated0 != 0 {
			t.Fatalf("%s: %d operations inserted, %d updated; want 1 and 0", tc.name, inserted-inserted0, updated-updated0)
		}
		var state, keyState string
		var records int64
		db.Raw(`SELECT state, key_state FROM operations WHERE id = ?`, a.op.ID).Row().Scan(&state, &keyState)
		db.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ?`, a.op.ID).Scan(&records)
		if state != "succeeded" || keyState != "completed" || records != 1 {
			t.Fatalf("%s: operation %s, key %s, %d records; want succeeded, completed and 1", tc.name, state, keyState, records)
		}
	}
}

func count(t *testing.T, db *gorm.DB, table string) (n int64) {
	t.Helper()
	if err := db.Table(table).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCompletionIsHeapOnly: an external completion moves its operation from running to succeeded and stores the
// response without changing any indexed column, so PostgreSQL updates the row in place (HOT) instead of adding
// an entry to each of the table's indexes. An index on state, key_state or updated_at would end that: index the
// generated columns (unknown, key_held) instead (migrations/00001_baseline.sql).
func TestCompletionIsHeapOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Schema(t).DB
	h := &Handler{DB: db}
	a := newAttempt("acct", "hot", "fp")
	tx, err := database.Begin(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if err := h.claim(ctx, tx, a, Request{}); err != nil {
		t.Fatal(err)
	}
	// The counters also hold what earlier transactions of this connection did and the server has not collected
	// yet: the completion's share is the difference.
	const counters = `SELECT pg_stat_get_xact_tuples_updated('operations'::regclass), pg_stat_get_xact_tuples_hot_updated('operations'::regclass)`
	var updated0, hot0, updated, hot int64
	before := &pgx.Batch{}
	before.Queue(counters).QueryRow(func(row pgx.Row) error { return row.Scan(&updated0, &hot0) })
	if err := tx.Send(ctx, before); err != nil {
		t.Fatal(err)
	}
	_, b, err := h.completion(a, Result{Status: 201, Body: map[string]any{"id": "x"}, Resource: &opstatus.Resource{Type: "note", ID: "x"}},
		opstore.EventCompleted)
	if err != nil {
		t.Fatal(err)
	}
	b.Queue(counters).QueryRow(func(row pgx.Row) error { return row.Scan(&updated, &hot) })
	if err := tx.Commit(ctx, b); err != nil {
		t.Fatal(err)
	}
	if updated, hot = updated-updated0, hot-hot0; updated != 1 || hot != 1 {
		t.Fatalf("the completion updated %d operation rows, %d of them heap-only; want 1 and 1", updated, hot)
	}
}

// TestPruneKeepsWhatIsStillOwed: only keys of final operations lose their response, and only after the
// retention; keys of running, unknown and queued operations are kept whatever their age; a key lives until its
// own lifetime, and its operation and history outlive it.
func TestPruneKeepsWhatIsStillOwed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Schema(t).DB
	h := &Handler{DB: db, Retention: time.Hour, KeyLifetime: 2 * time.Hour}
	done := newAttempt("acct", "done", "fp")
	claimed(t, h, done)
	completed(t, h, done, opstatus.StateSucceeded)
	claimed(t, h, newAttempt("acct", "running", "fp"))
	unknown := newAttempt("acct", "unknown", "fp")
	claimed(t, h, unknown)
	if _, err := opstatus.Transition(ctx, database.SQL(db), "acct", unknown.op.ID, opstatus.StateUnknown, "test"); err != nil {
		t.Fatal(err)
	}
	queued := newAttempt("acct", "queued", "fp")
	claimed(t, h, queued)
	completed(t, h, queued, opstatus.StateQueued)
	age := func(by time.Duration) {
		t.Helper()
		err := db.Exec(`UPDATE operations SET created_at = created_at - ?::interval, completed_at = completed_at - ?::interval,
    response_expires_at = response_expires_at - ?::interval, key_expires_at = key_expires_at - ?::interval`,
			by.String(), by.String(), by.String(), by.String()).Error
		if err != nil {
			t.Fatal(err)
		}
	}
	states := func() map[string]string {
		var rows []struct{ IdempotencyKey, State string }
		db.Raw(`SELECT idempotency_key, key_state AS state FROM operations WHERE key_state IS NOT NULL`).Scan(&rows)
		m := map[string]string{}
		for _, r := range rows {
			m[r.IdempotencyKey] = r.State
		}
		return m
	}
	if r, k, err := h.Prune(ctx); err != nil || r != 0 || k != 0 {
		t.Fatalf("prune of young keys: %d responses, %d keys, %v", r, k, err)
	}
	age(90 * time.Minute)
	if r, k, err := h.Prune(ctx); err != nil || r != 1 || k != 0 {
		t.Fatalf("prune after the retention: %d responses, %d keys, %v; want the finished key's response", r, k, err)
	}
	if got := states(); got["done"] != "expired" || got["running"] != "running" || got["unknown"] != "running" || got["queued"] != "completed" {
		t.Fatalf("keys after the retention: %v", got)
	}
	age(time.Hour)
	if r, k, err := h.Prune(ctx); err != nil || r != 0 || k != 1 {
		t.Fatalf("prune after the lifetime: %d responses, %d keys, %v; want the finished key", r, k, err)
	}
	if got := states(); len(got) != 3 || got["done"] != "" {
		t.Fatalf("keys after the lifetime: %v; want running, unknown and queued kept", got)
	}
	if _, err := opstatus.Get(ctx, database.SQL(db), "acct", done.op.ID); err != nil {
		t.Errorf("operation of a pruned key: %v", err)
	}
}

// TestWaitersAreBounded: with one place to wait (MaxWaiters 1), a retry that asks to wait (Prefer: wait) while
// the first request still runs takes it and waits for the result; another that asks too is answered 409 at once
// instead of polling the database beside it.
func TestWaitersAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := &Handler{DB: testdb.Schema(t).DB, MaxWaiters: 1, Lease: 10 * time.Second}
	release := make(chan struct{})
	steps := ExternalSteps[string]{
		Call: func(ctx context.Context, op opstatus.Operation) (string, error) { <-release; return "done", nil },
		Record: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, out string, err error) (Result, error) {
			return Result{Status: 201, Body: map[string]string{"out": out}}, err
		},
	}
	call := func(wait bool) Call {
		header := http.Header{headerKey: {"k-wait"}}
		if wait {
			header.Set("Prefer", "wait=30")
		}
		return Call{Method: "POST", Route: "/sends", Header: header, Caller: Caller{AccountID: "acct", Actor: "test"}}
	}
	req := Request{Kind: "test.send", Command: map[string]any{}}
	if !h.takeWaiter() { // makes the places, so the test can watch them
		t.Fatal("no place to wait")
	}
	h.waiters <- struct{}{}
	first, waiter := make(chan Answer, 1), make(chan Answer, 1)
	go func() { first <- RunExternal(ctx, h, call(false), req, steps) }()
	poll.Until(t, "the first request holds its claim", func() bool {
		s, found, err := h.readKey(ctx, "acct", "k-wait")
		return err == nil && found && s.opState == opstatus.StateRunning
	})
	go func() { waiter <- RunExternal(ctx, h, call(true), req, steps) }()
	poll.Until(t, "the retry waits", func() bool { return len(h.waiters) == 0 })
	turnedAway := RunExternal(ctx, h, call(true), req, steps)
	var p *problem.Error
	if !errors.As(turnedAway.Err, &p) || p.Code != "request_in_progress" {
		t.Fatalf("a second waiter: %+v; want 409 request_in_progress at once", turnedAway)
	}
	close(release)
	if a := <-first; a.Status != 201 {
		t.Fatalf("first: %+v", a)
	}
	if a := <-waiter; a.Status != 201 || a.Header.Get(headerReplayed) != "true" {
		t.Fatalf("the waiter: %+v; want the result it waited for", a)
	}
}
