package database_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// probe is a pool of one connection on an empty schema with two tables: notes, and refs whose foreign key to
// notes is checked at COMMIT. One connection, so every test also shows the connection came back usable.
func probe(t *testing.T, dsn string, o database.Options) *gorm.DB {
	t.Helper()
	o.MaxConns = 1
	db := open(t, dsn, o).DB
	err := db.Exec(`CREATE TABLE IF NOT EXISTS notes (id int PRIMARY KEY);
CREATE TABLE IF NOT EXISTS refs (note int REFERENCES notes DEFERRABLE INITIALLY DEFERRED)`).Error
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func notes(t *testing.T, db *gorm.DB) []int {
	t.Helper()
	var ids []int
	if err := db.Raw(`SELECT id FROM notes ORDER BY id`).Scan(&ids).Error; err != nil {
		t.Fatalf("reading the notes (is the connection back idle?): %v", err)
	}
	return ids
}

func scanInts(into *[]int) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		for rows.Next() {
			var n int
			if err := rows.Scan(&n); err != nil {
				return err
			}
			*into = append(*into, n)
		}
		return rows.Err()
	}
}

// begun begins a pipelined transaction on db whose statement sent with BEGIN inserts note 1, and checks the
// rows that statement returned.
func begun(t *testing.T, db *gorm.DB) *database.PipelinedTx {
	t.Helper()
	ctx := context.Background()
	tx, err := database.BeginPipelined(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	if err := tx.Begin(ctx, scanInts(&got), `INSERT INTO notes VALUES ($1) RETURNING id`, 1); err != nil {
		tx.Close()
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != 1 {
		tx.Close()
		t.Fatalf("rows of the statement sent with BEGIN: %v", got)
	}
	return tx
}

// TestPipelinedTxCommitsAllItSent: the statement sent with BEGIN, one through gorm in between, and the one sent
// with COMMIT are one transaction, invisible to others until the COMMIT.
func TestPipelinedTxCommitsAllItSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testdb.EmptySchema(t)
	db := probe(t, dsn, database.Options{AcquireTimeout: time.Second})
	other := open(t, dsn, database.Options{}).DB

	tx := begun(t, db)
	defer tx.Close()
	if err := tx.DB().Exec(`INSERT INTO notes VALUES (?)`, 2).Error; err != nil {
		t.Fatal(err)
	}
	var inTx int
	tx.DB().Raw(`SELECT count(*) FROM notes`).Scan(&inTx)
	if inTx != 2 {
		t.Fatalf("the transaction sees %d notes; want its 2", inTx)
	}
	if ids := notes(t, other); len(ids) != 0 {
		t.Fatalf("another connection sees %v before the COMMIT", ids)
	}
	if err := tx.Commit(ctx, `INSERT INTO notes VALUES ($1)`, 3); err != nil {
		t.Fatal(err)
	}
	tx.Close()
	if ids := notes(t, db); len(ids) != 3 {
		t.Fatalf("notes after COMMIT: %v; want 1, 2, 3", ids)
	}
}

// TestPipelinedTxCloseRollsBack: a transaction that never commits leaves nothing, and its connection goes back
// to the pool idle.
func TestPipelinedTxCloseRollsBack(t *testing.T) {
	t.Parallel()
	db := probe(t, testdb.EmptySchema(t), database.Options{})
	tx := begun(t, db)
	tx.Close()
	if ids := notes(t, db); len(ids) != 0 {
		t.Fatalf("notes after Close without Commit: %v; want none", ids)
	}
}

// TestPipelinedCommitFailsWithItsStatement: when the statement sent with COMMIT fails, or the COMMIT itself
// (a deferred foreign key), the database's error comes back and nothing of the transaction is kept.
func TestPipelinedCommitFailsWithItsStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := probe(t, testdb.EmptySchema(t), database.Options{})
	for _, tc := range []struct {
		name, last, code string
	}{
		{"statement", `INSERT INTO notes VALUES (1)`, "23505"},    // the note Begin inserted: unique violation
		{"deferred key", `INSERT INTO refs VALUES (99)`, "23503"}, // no note 99, found at COMMIT
	} {
		tx := begun(t, db)
		err := tx.Commit(ctx, tc.last)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
			t.Fatalf("%s: Commit = %v; want the database's %s", tc.name, err, tc.code)
		}
		tx.Close()
		if ids := notes(t, db); len(ids) != 0 {
			t.Fatalf("%s: notes after the failed Commit: %v; want none", tc.name, ids)
		}
	}
}

// TestPipelinedTxNestsAsSavepoints: gorm sees the transaction as one already open, so a nested Transaction is a
// savepoint, and gorm cannot commit or roll it back behind the pipeline's back.
func TestPipelinedTxNestsAsSavepoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := probe(t, testdb.EmptySchema(t), database.Options{})
	tx := begun(t, db)
	defer tx.Close()
	inner := tx.DB().Transaction(func(sp *gorm.DB) error {
		if err := sp.Exec(`INSERT INTO notes VALUES (2)`).Error; err != nil {
			return err
		}
		return errors.New("undo the savepoint")
	})
	if inner == nil {
		t.Fatal("the nested transaction's error was lost")
	}
	if err := tx.DB().Commit().Error; err == nil {
		t.Fatal("gorm's Commit ended the pipelined transaction")
	}
	if err := tx.Commit(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if ids := notes(t, db); len(ids) != 1 || ids[0] != 1 {
		t.Fatalf("notes: %v; want 1 alone (2 was in the rolled back savepoint)", ids)
	}
}

// TestPipelinedCommitLostIsAStoreFailure: the connection drops after the COMMIT's pipeline left. The error is a
// store failure (the caller cannot know whether it committed), and the pool replaces the connection.
func TestPipelinedCommitLostIsAStoreFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := proxy(t)
	db := probe(t, p.DSN(testdb.EmptySchema(t)), database.Options{StatementTimeout: 500 * time.Millisecond})
	tx := begun(t, db)
	p.Stall(true)
	err := tx.Commit(ctx, `INSERT INTO notes VALUES ($1)`, 2)
	if err == nil || !problem.IsStoreUnavailable(err) {
		t.Fatalf("Commit with its answer lost: %v; want a store failure", err)
	}
	tx.Close()
	p.Stall(false)
	p.CutAll()
	if ids := notes(t, db); len(ids) != 0 && len(ids) != 2 {
		t.Fatalf("notes: %v; want all of the transaction or none of it", ids)
	}
}

// TestSendBatchIsOneImplicitTransaction: a batch's results come back in its order, and a batch whose second
// statement fails keeps nothing of the first; the connection goes back to the pool usable either way.
func TestSendBatchIsOneImplicitTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := probe(t, testdb.EmptySchema(t), database.Options{})
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO notes VALUES (1)`)
	b.Queue(`INSERT INTO notes VALUES (1)`)
	err := database.SendBatch(ctx, db, b, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		_, err := br.Exec()
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("batch with a duplicate: %v; want the unique violation", err)
	}
	if ids := notes(t, db); len(ids) != 0 {
		t.Fatalf("notes after the failed batch: %v; want none", ids)
	}
	b = &pgx.Batch{}
	for _, n := range []int{3, 1, 2} {
		b.Queue(`SELECT $1::int * 10`, n)
	}
	var got []int
	err = database.SendBatch(ctx, db, b, func(br pgx.BatchResults) error {
		for range 3 {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			if err := scanInts(&got)(rows); err != nil {
				return err
			}
			rows.Close()
		}
		return nil
	})
	if err != nil || len(got) != 3 || got[0] != 30 || got[1] != 10 || got[2] != 20 {
		t.Fatalf("batch of reads: %v, %v; want 30 10 20", got, err)
	}
	if ids := notes(t, db); len(ids) != 0 {
		t.Fatalf("after the reads: %v", ids)
	}
}

// queued begins a pipelined transaction on db with query queued by BeginWithNext (begun and args as there).
func queued(t *testing.T, db *gorm.DB, begun func(), query string, args ...any) *database.PipelinedTx {
	t.Helper()
	tx, err := database.BeginPipelined(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.BeginWithNext(begun, query, args...); err != nil {
		tx.Close()
		t.Fatal(err)
	}
	return tx
}

// TestBeginWithNextTravelsWithTheNextStatement: the statement BeginWithNext queues runs first, in the
// transaction that the next statement (Query's, any gorm statement, or Commit's) begins with it; begun runs once
// it has run, before Query returns, and not for Commit, which has ended the transaction. Query maps the rows
// that come back through pgx by column as gorm does (a column tag, an unmapped column ignored).
func TestBeginWithNextTravelsWithTheNextStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := probe(t, testdb.EmptySchema(t), database.Options{})
	type row struct {
		ID      int
		Tenfold int `gorm:"column:ten"`
	}
	for _, next := range []string{"Query", "gorm", "Commit"} {
		db.Exec(`DELETE FROM notes`)
		var order []string
		tx := queued(t, db, func() { order = append(order, "begun") }, `INSERT INTO notes VALUES ($1)`, 1)
		var err error
		switch next {
		case "Query":
			rows, err := database.Query[row](tx.DB(), `INSERT INTO notes VALUES (?) RETURNING id, id * 10 AS ten, 'x' AS extra`, 2)
			order = append(order, "returned")
			if err != nil || len(rows) != 1 || rows[0] != (row{2, 20}) {
				t.Fatalf("Query sent with BEGIN: %v, %v; want [{2 20}]", rows, err)
			}
		case "gorm":
			err = tx.DB().Exec(`INSERT INTO notes VALUES (?)`, 2).Error
			order = append(order, "returned")
		}
		if err == nil {
			err = tx.Commit(ctx, map[bool]string{true: `INSERT INTO notes VALUES (2)`}[next == "Commit"])
		}
		if err != nil {
			t.Fatalf("%s: %v", next, err)
		}
		tx.Close()
		want := []string{"begun", "returned"}
		if next == "Commit" {
			want = nil
		}
		if len(order) != len(want) || (len(want) > 0 && (order[0] != want[0] || order[1] != want[1])) {
			t.Fatalf("%s: order %v; want %v", next, order, want)
		}
		if ids := notes(t, db); len(ids) != 2 || ids[0] != 1 || ids[1] != 2 {
			t.Fatalf("%s: notes %v; want 1 (queued) and 2 (sent with it)", next, ids)
		}
	}
}

// TestBeginWithNextFailureSkipsWhatTravelsWithIt: when the queued statement fails, the statement sent with it
// never runs (whether Query's, gorm's or Commit's), its caller gets the queued statement's error, BeginErr keeps
// it, begun is not called, and Close leaves nothing and the connection usable.
func TestBeginWithNextFailureSkipsWhatTravelsWithIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := probe(t, testdb.EmptySchema(t), database.Options{})
	if err := db.Exec(`INSERT INTO notes VALUES (1)`).Error; err != nil {
		t.Fatal(err)
	}
	for _, next := range []string{"Query", "gorm", "Commit"} {
		called := false
		tx := queued(t, db, func() { called = true }, `INSERT INTO notes VALUES ($1)`, 1)
		var err error
		switch next {
		case "Query":
			_, err = database.Query[struct{ ID int }](tx.DB(), `INSERT INTO notes VALUES (5) RETURNING id`)
		case "gorm":
			err = tx.DB().Exec(`INSERT INTO notes VALUES (5)`).Error
		case "Commit":
			err = tx.Commit(ctx, `INSERT INTO notes VALUES (5)`)
		}
		var pgErr, kept *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" || !errors.As(tx.BeginErr(), &kept) || kept.Code != "23505" {
			t.Fatalf("%s after a failing queued statement: %v (BeginErr %v); want its unique violation", next, err, tx.BeginErr())
		}
		if called {
			t.Fatalf("%s: begun ran for a queued statement that failed", next)
		}
		tx.Close()
		if ids := notes(t, db); len(ids) != 1 || ids[0] != 1 {
			t.Fatalf("%s: notes %v; want 1 alone (5 never ran)", next, ids)
		}
	}
}

// TestBeginWithNextUnsentIsDropped: a transaction closed before anything went out sends nothing.
func TestBeginWithNextUnsentIsDropped(t *testing.T) {
	t.Parallel()
	db := probe(t, testdb.EmptySchema(t), database.Options{})
	tx := queued(t, db, nil, `INSERT INTO notes VALUES (1)`)
	if err := tx.BeginWithNext(nil, `INSERT INTO notes VALUES (2)`); err == nil {
		t.Fatal("a second BeginWithNext was taken")
	}
	tx.Close()
	if ids := notes(t, db); len(ids) != 0 {
		t.Fatalf("notes %v; want none", ids)
	}
}

// TestBeginWithNextBeginAlone: with no statement of its own, BEGIN alone waits for the next statement: what
// Query sends is inside the transaction (another connection sees nothing of it until Commit), and Close
// without Commit leaves nothing.
func TestBeginWithNextBeginAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testdb.EmptySchema(t)
	db := probe(t, dsn, database.Options{})
	other := open(t, dsn, database.Options{}).DB
	for _, commit := range []bool{true, false} {
		tx := queued(t, db, nil, "")
		if _, err := database.Query[struct{ ID int }](tx.DB(), `INSERT INTO notes VALUES (7) RETURNING id`); err != nil {
			t.Fatal(err)
		}
		if ids := notes(t, other); len(ids) != 0 {
			t.Fatalf("another connection sees %v before the COMMIT: the statement ran outside a transaction", ids)
		}
		if commit {
			if err := tx.Commit(ctx, ""); err != nil {
				t.Fatal(err)
			}
		}
		tx.Close()
		want := map[bool]int{true: 1, false: 0}[commit]
		if ids := notes(t, db); len(ids) != want {
			t.Fatalf("commit %v: notes %v; want %d", commit, ids, want)
		}
		db.Exec(`DELETE FROM notes`)
	}
}
