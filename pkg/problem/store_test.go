package problem_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/internal/faultproxy"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

func TestStoreUnavailableByType(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("idem: claim: %w", err) }
	unavailable := []error{
		io.ErrUnexpectedEOF,
		wrap(io.ErrUnexpectedEOF),
		wrap(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}),
		wrap(refusedConnect(t)),
		wrap(driver.ErrBadConn),
		wrap(sql.ErrConnDone),
		wrap(context.DeadlineExceeded),
		wrap(&pgconn.PgError{Code: "08006"}),
		wrap(&pgconn.PgError{Code: "57P01"}),
		wrap(&pgconn.PgError{Code: "57P03"}),
		wrap(&pgconn.PgError{Code: "57014"}),
		wrap(&pgconn.PgError{Code: "53300"}),
		problem.ErrStoreUnavailable,
	}
	for _, err := range unavailable {
		if !problem.IsStoreUnavailable(err) {
			t.Errorf("IsStoreUnavailable(%v) = false", err)
		}
	}
	refused := []error{
		nil,
		errors.New("unexpected EOF"), // the text alone is no evidence
		wrap(&pgconn.PgError{Code: "23505"}),
		wrap(&pgconn.PgError{Code: "40001"}),
		wrap(context.Canceled),
		problem.ErrNotFound,
	}
	for _, err := range refused {
		if problem.IsStoreUnavailable(err) {
			t.Errorf("IsStoreUnavailable(%v) = true", err)
		}
	}
}

// TestConnectionKilledUnderWaitingStatement: a statement is waiting when its connection dies, the two ways a
// restart shows itself to a client: the server terminates the backend (57P01, what a fast shutdown sends), or
// the connection just drops (what a crash or an immediate restart looks like: unexpected EOF). Both are
// store_unavailable, and so is connecting while the server refuses connections.
func TestConnectionKilledUnderWaitingStatement(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	direct := testdb.Schema(t)

	waiting := func(t *testing.T, dsn, app string, kill func()) error {
		t.Helper()
		q := mustURL(t, dsn)
		v := q.Query()
		v.Set("application_name", app)
		q.RawQuery = v.Encode()
		db, err := database.Open(q.String(), database.Options{MaxConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		sqlDB, _ := db.DB()
		defer sqlDB.Close()
		done := make(chan error, 1)
		// With an argument, so pgx uses the extended protocol like every store statement here. (Without one pgx
		// v5.12 reports a dropped connection as "conn closed", safe to retry, and database/sql runs it again.)
		go func() { done <- db.Exec(`SELECT pg_sleep(?)`, 30).Error }()
		servicetest.Eventually(t, "the statement waits", func() bool {
			var n int64
			direct.Raw(`SELECT count(*) FROM pg_stat_activity WHERE application_name = ? AND query LIKE 'SELECT pg_sleep%'`, app).Scan(&n)
			return n == 1
		})
		kill()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("the statement outlived its connection")
			return nil
		}
	}

	t.Run("terminated by the server", func(t *testing.T) {
		app := fmt.Sprintf("killtest_%d", time.Now().UnixNano())
		err := waiting(t, testdb.URL(), app, func() {
			direct.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ?`, app)
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57P01" || !problem.IsStoreUnavailable(err) {
			t.Fatalf("err = %v; want 57P01, store unavailable", err)
		}
	})
	t.Run("connection dropped", func(t *testing.T) {
		p := faultproxy.Start(t, u.Host)
		app := fmt.Sprintf("droptest_%d", time.Now().UnixNano())
		err := waiting(t, p.DSN(testdb.URL()), app, p.CutAll)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("err = %v; want the driver's unexpected EOF", err)
		}
		if err == nil || !problem.IsStoreUnavailable(err) {
			t.Fatalf("err = %v; want store unavailable", err)
		}
		// Cancel the orphaned sleep on the server; the proxy cut only the client's side.
		direct.Exec(`SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = ?`, app)
	})
	t.Run("connections refused", func(t *testing.T) {
		p := faultproxy.Start(t, u.Host)
		p.Refuse(true)
		db, err := database.Open(p.DSN(testdb.URL()), database.Options{MaxConns: 1, ConnectTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		err = db.Exec(`SELECT 1`).Error
		if err == nil || !problem.IsStoreUnavailable(err) {
			t.Fatalf("err = %v; want store unavailable", err)
		}
	})
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestDroppedDatabaseIsUnavailable: a database that is missing, or dropped under a running pool, answers 503
// store_unavailable on every request, never 500: the server refuses each new connection (3D000) and the
// connections it had are terminated.
func TestDroppedDatabaseIsUnavailable(t *testing.T) {
	t.Parallel()
	admin := testdb.Schema(t)
	name := fmt.Sprintf("dropped_%d", time.Now().UnixNano())
	if err := admin.Exec(`CREATE DATABASE ` + name).Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`) })
	u := mustURL(t, testdb.URL())
	u.Path = "/" + name
	db, err := database.Open(u.String(), database.Options{MaxConns: 2, ConnectTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	if err := db.Exec(`SELECT ?::int`, 1).Error; err != nil {
		t.Fatalf("before the drop: %v", err)
	}
	if err := admin.Exec(`DROP DATABASE ` + name + ` WITH (FORCE)`).Error; err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		err := db.Exec(`SELECT ?::int`, 1).Error
		w := httptest.NewRecorder()
		problem.Write(w, httptest.NewRequest(http.MethodPost, "/v1/things", nil), err)
		if err == nil || w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), `"store_unavailable"`) {
			t.Fatalf("request %d after the drop: %v, answered %d %s; want 503 store_unavailable", i, err, w.Code, w.Body)
		}
	}
}

// refusedConnect is the driver's error for a server that refuses the connection.
func refusedConnect(t *testing.T) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = pgconn.Connect(context.Background(), "postgres://x@"+addr+"/x?connect_timeout=5")
	var connectErr *pgconn.ConnectError
	if !errors.As(err, &connectErr) {
		t.Fatalf("connect to a closed port: %v; want a ConnectError", err)
	}
	return err
}
