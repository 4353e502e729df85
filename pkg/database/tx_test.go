package database_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// scratch makes a table of its own for one test and drops it after.
func scratch(t *testing.T, p pool) string {
	t.Helper()
	name := fmt.Sprintf("tx_queue_%d", time.Now().UnixNano())
	if err := p.DB.Exec(`CREATE TABLE ` + name + ` (n int)`).Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.DB.Exec(`DROP TABLE ` + name) })
	return name
}

func count(t *testing.T, p pool, table string) int {
	t.Helper()
	var n int
	if err := p.DB.Raw(`SELECT count(*) FROM ` + table).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// TestQueuedGoesWithTheNextStatement: a queued batch is sent with the transaction's next statement, in the
// transaction and before it, whether that statement goes through database.Query or gorm, and its callbacks run
// then; a queued batch never followed by a statement is never sent.
func TestQueuedGoesWithTheNextStatement(t *testing.T) {
	p := open(t, testdb.URL(), database.Options{MaxConns: 2})
	table := scratch(t, p)
	ctx := context.Background()
	for _, next := range []string{"query", "gorm"} {
		tx, err := database.Begin(ctx, p.DB)
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO ` + table + ` VALUES (1)`).Exec(func(pgconn.CommandTag) error { ran = true; return nil })
		tx.Queue(b)
		var seen int
		switch next {
		case "query":
			err = database.Query(ctx, tx.Gorm(), `SELECT count(*) FROM `+table, nil, func(rows pgx.Rows) error {
				rows.Next()
				return rows.Scan(&seen)
			})
		case "gorm":
			err = tx.Gorm().Raw(`SELECT count(*) FROM ` + table).Scan(&seen).Error
		}
		if err != nil {
			t.Fatal(next, err)
		}
		if !ran || seen != 1 {
			t.Fatalf("%s: the queued insert ran %v, the next statement saw %d rows; want it run before, in the transaction", next, ran, seen)
		}
		tx.Close() // rolls back
		if n := count(t, p, table); n != 0 {
			t.Fatalf("%s: %d rows after the rollback; want the queued insert rolled back with its transaction", next, n)
		}
	}

	tx, err := database.Begin(ctx, p.DB)
	if err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO ` + table + ` VALUES (1)`)
	tx.Queue(b)
	tx.Close()
	if n := count(t, p, table); n != 0 {
		t.Fatalf("%d rows after a queued batch with no statement after it; want nothing sent", n)
	}
}

// TestQueuedFailureFailsTheNextStatement: when a queued batch's callback fails, the statement sent with it
// returns that error without its own callback running, and nothing of the transaction commits.
func TestQueuedFailureFailsTheNextStatement(t *testing.T) {
	p := open(t, testdb.URL(), database.Options{MaxConns: 2})
	table := scratch(t, p)
	ctx := context.Background()
	tx, err := database.Begin(ctx, p.DB)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	refused := errors.New("refused by the queued batch")
	b := &pgx.Batch{}
	b.Queue(`SELECT 1`).QueryRow(func(pgx.Row) error { return refused })
	tx.Queue(b)
	scanned := false
	err = database.Query(ctx, tx.Gorm(), `INSERT INTO `+table+` VALUES (1) RETURNING n`, nil, func(rows pgx.Rows) error {
		scanned = true
		return nil
	})
	if !errors.Is(err, refused) || scanned {
		t.Fatalf("the statement sent with a failing queued batch: %v, its scan ran %v; want the queued error and no scan", err, scanned)
	}
	if err := tx.Commit(ctx, nil); err == nil {
		t.Fatal("the transaction committed after its queued batch failed")
	}
	if n := count(t, p, table); n != 0 {
		t.Fatalf("%d rows; want none", n)
	}
}
