package database_test

import (
	"bytes"
	"context"
	"database/sql/driver"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// TestDatabaseGoneIsUnavailable: a transaction whose connection the database drops before its first statement
// (a gorm row read, which BEGIN goes with) fails with ErrUnavailable carrying the driver's cause, answered 503
// store_unavailable with that cause in the log, not a 500 whose cause is lost. Not parallel: it reads the
// default logger.
func TestDatabaseGoneIsUnavailable(t *testing.T) {
	p := proxy(t)
	pool := open(t, p.DSN(testdb.URL()), database.Options{MaxConns: 2, ConnectTimeout: time.Second,
		AcquireTimeout: time.Second, StatementTimeout: time.Second})
	ctx := context.Background()
	tx, err := database.Begin(ctx, pool.DB)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	p.CutAll() // the database goes away with the transaction's connection
	var n int
	err = tx.Gorm().Raw(`SELECT 1`).Row().Scan(&n)
	if !errors.Is(err, database.ErrUnavailable) {
		t.Fatalf("a row read on a dropped connection: %v; want ErrUnavailable", err)
	}
	var unavailable *database.UnavailableError
	if !errors.As(err, &unavailable) || unavailable.Cause == nil || errors.Is(unavailable.Cause, context.Canceled) ||
		errors.Is(unavailable.Cause, driver.ErrBadConn) {
		t.Fatalf("the error %v does not carry the driver's cause", err)
	}

	checkAnswer(t, err, unavailable.Cause.Error())
}

// TestNoFreeConnectionIsUnavailable: a row read that finds no free connection within the pool's acquire bound
// fails with ErrUnavailable, answered 503 with the bound it ran out of in the log.
func TestNoFreeConnectionIsUnavailable(t *testing.T) {
	pool := open(t, testdb.URL(), database.Options{MaxConns: 1, AcquireTimeout: 200 * time.Millisecond})
	tx, err := database.Begin(context.Background(), pool.DB) // holds the pool's one connection
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	var n int
	err = pool.DB.Raw(`SELECT 1`).Row().Scan(&n)
	if !errors.Is(err, database.ErrUnavailable) {
		t.Fatalf("a row read on a full pool: %v; want ErrUnavailable", err)
	}
	checkAnswer(t, err, "no free connection within 200ms")
}

// checkAnswer checks that err is answered 503 store_unavailable and logged with cause.
func checkAnswer(t *testing.T, err error, cause string) {
	t.Helper()
	var log bytes.Buffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
	rec := httptest.NewRecorder()
	problem.Write(rec, httptest.NewRequest(http.MethodPost, "/v1/things", nil), err)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "store_unavailable") {
		t.Fatalf("answer: %d %s; want 503 store_unavailable", rec.Code, rec.Body.String())
	}
	if !strings.Contains(log.String(), cause) {
		t.Fatalf("the log does not say the cause %q:\n%s", cause, log.String())
	}
}
