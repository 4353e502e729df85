package database_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// TestDeferredBatchGoesWithTheNextStatement: a batch given to Defer runs first, in the transaction, with the next
// statement sent through Query, Commit or Gorm; when it fails, the statement sent with it does not run, and its
// error reaches both the caller and DeferredErr.
func TestDeferredBatchGoesWithTheNextStatement(t *testing.T) {
	db := testdb.Schema(t)
	ctx := context.Background()
	if err := db.Exec(`CREATE TABLE IF NOT EXISTS tx_probe (id text PRIMARY KEY); TRUNCATE tx_probe`).Error; err != nil {
		t.Fatal(err)
	}
	insert := func(id string) *pgx.Batch {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO tx_probe (id) VALUES ($1)`, id)
		return b
	}
	stored := func() []string {
		var ids []string
		if err := db.Raw(`SELECT id FROM tx_probe ORDER BY id`).Scan(&ids).Error; err != nil {
			t.Fatal(err)
		}
		return ids
	}
	begin := func() *database.Tx {
		tx, err := database.Begin(ctx, db.DB)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tx.Close)
		if database.TxOf(tx.Gorm()) != tx || database.TxOf(db.DB) != nil {
			t.Fatal("TxOf does not find the Tx of its own gorm handle, or finds one under the pool")
		}
		return tx
	}

	tx := begin()
	tx.Defer(insert("a"))
	var seen []string
	err := tx.Query(ctx, func(r pgx.Rows) (err error) {
		seen, err = pgx.CollectRows(r, pgx.RowTo[string])
		return err
	}, `INSERT INTO tx_probe (id) VALUES ('b') RETURNING (SELECT string_agg(id, ',') FROM tx_probe)`)
	if err != nil || len(seen) != 1 || seen[0] != "a" {
		t.Fatalf("Query after Defer: %v, it saw %q; want the deferred row, already inserted", err, seen)
	}
	if err := tx.Commit(ctx, nil); err != nil || tx.DeferredErr() != nil {
		t.Fatalf("commit: %v, DeferredErr %v", err, tx.DeferredErr())
	}

	tx = begin()
	tx.Defer(insert("a")) // taken: the statement after it must not run
	scanned := false
	err = tx.Query(ctx, func(pgx.Rows) error { scanned = true; return nil }, `INSERT INTO tx_probe (id) VALUES ('c') RETURNING id`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || tx.DeferredErr() != err || scanned {
		t.Fatalf("a failed deferred batch: Query %v, DeferredErr %v, rows scanned %v; want its unique violation, no rows", err, tx.DeferredErr(), scanned)
	}
	tx.Close()

	tx = begin()
	tx.Defer(insert("g"))
	var n int64
	if err := tx.Gorm().Raw(`SELECT count(*) FROM tx_probe WHERE id = 'g'`).Scan(&n).Error; err != nil || n != 1 {
		t.Fatalf("a gorm statement after Defer: %v, saw %d deferred rows; want 1", err, n)
	}
	if err := tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}

	tx = begin()
	tx.Defer(insert("z"))
	if err := tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := stored(); len(got) != 4 || got[0] != "a" || got[1] != "b" || got[2] != "g" || got[3] != "z" {
		t.Fatalf("stored %q; want a, b, g and z (c never ran)", got)
	}
}
