package database

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"
)

// Tx is one transaction on one connection of a pool, reachable two ways: pgx batches (Send, Commit) for the
// library's own statements, and a gorm handle (Gorm) for the caller's write. Both run on the same connection,
// inside the same transaction, whatever the gorm configuration of the pool it came from.
//
// Round trips are saved by name, not hidden: BEGIN is sent with the first batch (or the first gorm statement),
// COMMIT with the last batch (Commit), and a batch held by Queue goes with the next round trip, whatever sends
// it. docs/benchmarks.md has what that is worth.
//
//	tx, err := database.Begin(ctx, db)
//	if err != nil { ... }
//	defer tx.Close()                // rolls back unless Commit succeeded
//	tx.Queue(claimBatch)            // nothing sent yet
//	err = write(ctx, tx.Gorm())     // BEGIN + the claim go with the write's first statement (Query), or just
//	                                // before it (a gorm statement)
//	err = tx.Commit(ctx, lastBatch) // the batch + COMMIT: one round trip
type Tx struct {
	conn  *sql.Conn
	gorm  *gorm.DB
	state txState
	// queued goes in front of the next batch sent (Queue).
	queued *pgx.Batch
}

type txState int

const (
	txIdle      txState = iota // nothing sent: BEGIN goes with the first statement
	txOpen                     // BEGIN sent: Close rolls back
	txFailed                   // a batch failed: nothing more is sent, Close rolls back
	txCommitted                // COMMIT answered
)

// Begin reserves a connection of db's pool for a transaction, within the pool's acquire bound (Options). Nothing
// is sent yet. Close must follow.
func Begin(ctx context.Context, db *gorm.DB) (*Tx, error) {
	conn, err := poolConn(ctx, db)
	if err != nil {
		return nil, err
	}
	t := &Tx{conn: conn}
	t.gorm = db.Session(&gorm.Session{Context: ctx, NewDB: true})
	t.gorm.Statement.ConnPool = &txConn{t: t}
	return t, nil
}

// Gorm is the transaction as a gorm handle. gorm sees a transaction already open: its default transaction
// (SkipDefaultTransaction false) is not started, a nested Transaction takes a savepoint, and Commit or Rollback
// on it fail: the transaction ends with Tx.Commit or Tx.Close.
func (t *Tx) Gorm() *gorm.DB { return t.gorm }

// SQL is the transaction as a DBTX, for the library's statements that run on their own rather than in a batch.
func (t *Tx) SQL() DBTX { return t.gorm.Statement.ConnPool }

// Queue holds b to be sent in front of the transaction's next round trip: the next Send, Commit or Query, or
// just before the next gorm statement (which cannot share a pipeline with it). Its callbacks run then, and its
// error is that round trip's. A second Queue before that adds its statements after the first's.
func (t *Tx) Queue(b *pgx.Batch) {
	if t.queued == nil {
		t.queued = &pgx.Batch{}
	}
	t.queued.QueuedQueries = append(t.queued.QueuedQueries, b.QueuedQueries...)
}

// Send sends b in one round trip, with BEGIN in front when the transaction has not begun, and runs the
// callbacks queued on b (QueuedQuery.Query, QueryRow, Exec). It returns the first error; PostgreSQL skips the
// statements after a failed one, and the transaction can then only be closed.
func (t *Tx) Send(ctx context.Context, b *pgx.Batch) error {
	return t.send(ctx, b, txOpen)
}

// Commit sends b (nil for none) and COMMIT in one round trip. When it returns nil the transaction committed. An
// error matching ErrUnavailable means the COMMIT may or may not have been applied.
func (t *Tx) Commit(ctx context.Context, b *pgx.Batch) error {
	if b == nil {
		b = &pgx.Batch{}
	}
	b.Queue("COMMIT")
	return t.send(ctx, b, txCommitted)
}

// Close rolls back a transaction that did not commit and gives the connection back to the pool, or discards it
// if it is not idle. It is safe to call more than once.
func (t *Tx) Close() {
	if t.conn == nil {
		return
	}
	_ = withPgx(t.conn, func(c *pgx.Conn) error {
		if (t.state == txOpen || t.state == txFailed) && !c.IsClosed() {
			// Not with the caller's context, which may be over.
			_, _ = c.Exec(context.Background(), "ROLLBACK")
		}
		if c.IsClosed() || c.PgConn().TxStatus() != 'I' {
			return driver.ErrBadConn // database/sql discards the connection
		}
		return nil
	})
	t.conn.Close()
	t.conn = nil
}

var (
	errTxDone   = errors.New("database: the transaction is over")
	errTxFailed = errors.New("database: a statement of this transaction failed: it can only be closed")
)

// send sends b, with BEGIN in front when nothing was sent yet and the queued batch (Queue) before it, and moves
// the transaction to after.
func (t *Tx) send(ctx context.Context, b *pgx.Batch, after txState) error {
	switch t.state {
	case txCommitted:
		return errTxDone
	case txFailed:
		return errTxFailed
	}
	var first []*pgx.QueuedQuery
	if t.state == txIdle {
		first = append(first, &pgx.QueuedQuery{SQL: "BEGIN"})
	}
	if t.queued != nil {
		first, t.queued = append(first, t.queued.QueuedQueries...), nil
	}
	if first != nil {
		b = &pgx.Batch{QueuedQueries: append(first, b.QueuedQueries...)}
	}
	err := withPgx(t.conn, func(c *pgx.Conn) error { return c.SendBatch(ctx, b).Close() })
	if err != nil {
		// A statement failed, a callback refused its rows, or the connection failed: PostgreSQL skips the rest of
		// a failed transaction, and a refusal must not commit either. Close rolls back or discards the connection.
		t.state = txFailed
		return unavailable(err)
	}
	t.state = after
	return nil
}

// begin sends BEGIN and the queued batch, if not sent yet, for a gorm statement that comes next.
func (t *Tx) begin(ctx context.Context) error {
	if t.state != txIdle && t.queued == nil {
		return nil
	}
	return t.send(ctx, &pgx.Batch{}, txOpen)
}

// Query runs one statement ($n placeholders, through pgx) and hands its rows to scan. On a Tx's handle (Tx.Gorm)
// it goes in the transaction's next round trip, with BEGIN and the queued batch (Queue) in front: a write whose
// first statement is sent this way carries its claim. On a pool it runs alone on one of its connections.
func Query(ctx context.Context, db *gorm.DB, sql string, args []any, scan func(pgx.Rows) error) error {
	b := &pgx.Batch{}
	b.Queue(sql, args...).Query(scan)
	if c, ok := db.Statement.ConnPool.(*txConn); ok {
		return c.t.Send(ctx, b)
	}
	return Send(ctx, db, b)
}

// Send sends b in one round trip on a connection of db's pool, outside any transaction of the caller: without
// a BEGIN in b its statements run in one implicit transaction (all commit, or none does).
func Send(ctx context.Context, db *gorm.DB, b *pgx.Batch) error {
	conn, err := poolConn(ctx, db)
	if err != nil {
		return err
	}
	defer conn.Close()
	return unavailable(withPgx(conn, func(c *pgx.Conn) error {
		err := c.SendBatch(ctx, b).Close()
		if c.IsClosed() || c.PgConn().TxStatus() != 'I' {
			if err == nil {
				err = driver.ErrBadConn
			}
			return errors.Join(err, driver.ErrBadConn) // database/sql discards the connection
		}
		return err
	}))
}

// poolConn reserves a connection of db's pool, within the pool's acquire bound.
func poolConn(ctx context.Context, db *gorm.DB) (*sql.Conn, error) {
	pool, err := pgxPool(db)
	if err != nil {
		return nil, err
	}
	if bound, ok := pool.(*acquireBound); ok {
		return bound.conn(ctx)
	}
	conn, err := pool.(*sql.DB).Conn(ctx)
	return conn, unavailable(err)
}

// Check reports, without connecting, whether db is a pool that Tx and Send can use: a *gorm.DB opened by Open
// or by gorm.io/driver/postgres (pgx), not a transaction and not another driver. The error says what to do.
func Check(db *gorm.DB) error {
	_, err := pgxPool(db)
	return err
}

func pgxPool(db *gorm.DB) (gorm.ConnPool, error) {
	if db == nil {
		return nil, errors.New("database: no pool: open one with database.Open or gorm.Open(postgres.Open(dsn), ...)")
	}
	pool := db.Statement.ConnPool
	if prepared, ok := pool.(*gorm.PreparedStmtDB); ok { // gorm.Config{PrepareStmt: true}
		pool = prepared.ConnPool
	}
	sqlDB, ok := pool.(*sql.DB)
	if bound, isBound := pool.(*acquireBound); isBound {
		sqlDB, ok = bound.DB, true
	}
	if !ok {
		return nil, fmt.Errorf("database: retrysafe needs the *gorm.DB of a pool (database.Open, or gorm.Open(postgres.Open(dsn), ...)), not one on a %T: pass the pool, not a transaction", pool)
	}
	if _, pgxDriver := sqlDB.Driver().(*stdlib.Driver); !pgxDriver {
		return nil, fmt.Errorf("database: retrysafe needs PostgreSQL through pgx (gorm.io/driver/postgres or database.Open), not the %T driver", sqlDB.Driver())
	}
	return pool, nil
}

// withPgx runs fn on the pgx connection under conn, a connection of a pool pgxPool accepted: pgx's driver.
func withPgx(conn *sql.Conn, fn func(*pgx.Conn) error) error {
	return conn.Raw(func(dc any) error { return fn(dc.(*stdlib.Conn).Conn()) })
}

// txConn is the transaction's connection as a gorm.ConnPool. It has no BeginTx, so gorm never starts a
// transaction of its own on it; its Commit and Rollback make gorm treat it as a transaction already open, and
// refuse to end it. It is used as a pointer: gorm checks it for nil with reflect.
type txConn struct{ t *Tx }

var errEndedByOwner = errors.New("database: this transaction is committed or rolled back by its owner (database.Tx), not through gorm")

func (p *txConn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := p.t.begin(ctx); err != nil {
		return nil, err
	}
	return p.t.conn.ExecContext(ctx, query, args...)
}

func (p *txConn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := p.t.begin(ctx); err != nil {
		return nil, err
	}
	return p.t.conn.QueryContext(ctx, query, args...)
}

func (p *txConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if err := p.t.begin(ctx); err != nil {
		return failedRow(ctx, err)
	}
	return p.t.conn.QueryRowContext(ctx, query, args...)
}

func (p *txConn) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	if err := p.t.begin(ctx); err != nil {
		return nil, err
	}
	return p.t.conn.PrepareContext(ctx, query)
}

func (*txConn) Commit() error   { return errEndedByOwner }
func (*txConn) Rollback() error { return errEndedByOwner }

var (
	_ gorm.ConnPool    = (*txConn)(nil)
	_ gorm.TxCommitter = (*txConn)(nil)
)
