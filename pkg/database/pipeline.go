package database

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// PipelinedTx is a transaction that spends no round trip of its own on BEGIN and COMMIT: BEGIN travels with the
// transaction's first statement (Begin) and COMMIT with its last (Commit), each pair in one pgx pipeline, and
// the statements in between run through gorm on the same connection (DB). A round trip to the database costs
// both processes a write, a read and a wakeup, which on a loopback connection is more CPU than a small insert;
// an idempotent write that is six round trips with gorm's Transaction is four with this.
//
// database/sql cannot do this: a *sql.Tx sends BEGIN alone and waits for its answer, and its rows are
// *sql.Rows, which only database/sql can make. So the two ends go to pgx directly (sql.Conn.Raw), and the
// connection is held as a *sql.Conn meanwhile: the pool counts it busy, and gives it back only in the idle state.
//
//	t, err := database.BeginPipelined(ctx, db)
//	if err != nil { ... }
//	defer t.Close()
//	err = t.Begin(ctx, scanClaim, claimSQL, args...)   // BEGIN + the claim, one round trip
//	... t.DB() for the write ...
//	err = t.Commit(ctx, completeSQL, args...)          // the completion + COMMIT, one round trip
//
// A first statement whose rows nobody needs can wait for the second instead (BeginWithNext): BEGIN, a claim and
// the first statement of the write it guards then share one round trip, and the write never runs unless the
// claim did, because PostgreSQL skips the rest of a pipeline after a statement fails.
type PipelinedTx struct {
	conn  *sql.Conn
	db    *gorm.DB
	state txState
	// next is the statement BeginWithNext queued, sent with BEGIN and the transaction's next statement.
	next pendingBegin
	// beginErr is the database's error for next, once it was sent and failed.
	beginErr error
}

// pendingBegin is the statement BeginWithNext queued, with what runs once it succeeded.
type pendingBegin struct {
	query string
	args  []any
	begun func()
}

type txState int

const (
	txIdle      txState = iota // nothing sent yet
	txPending                  // BEGIN queued with a statement (BeginWithNext), nothing sent yet
	txOpen                     // BEGIN sent: Close must roll back
	txCommitted                // COMMIT answered
	txBroken                   // the connection is unusable: Close discards it
)

// BeginPipelined reserves a connection of db's pool for a transaction, within the pool's acquire bound. Nothing
// is sent before Begin. Close must follow.
func BeginPipelined(ctx context.Context, db *gorm.DB) (*PipelinedTx, error) {
	conn, err := poolConn(ctx, db)
	if err != nil {
		return nil, err
	}
	t := &PipelinedTx{conn: conn}
	t.db = db.Session(&gorm.Session{Context: ctx, NewDB: true})
	t.db.Statement.ConnPool = &txPool{Conn: conn, t: t}
	return t, nil
}

// poolConn reserves a connection of db's pool, within the pool's acquire bound.
func poolConn(ctx context.Context, db *gorm.DB) (*sql.Conn, error) {
	switch pool := db.Statement.ConnPool.(type) {
	case *acquireBound:
		return pool.conn(ctx)
	case *sql.DB:
		return pool.Conn(ctx)
	default:
		return nil, fmt.Errorf("database: a pipeline needs the pool, not a %T", pool)
	}
}

// SendBatch sends the statements of b in one round trip on a connection of db's pool, and hands their results,
// in b's order, to read. Without a BEGIN in b they run in one implicit transaction (they all commit, or none
// does); the connection goes back to the pool idle, or is discarded.
//
// It is how many small reads share a round trip, each with its own prepared statement: one statement over
// arrays of all their arguments would be planned again at every execution, because the plan for the arrays at
// hand always looks cheaper to PostgreSQL than the cached generic one (0.3 to 0.5 ms of planning per batch of
// key reads, measured), where each small statement keeps its generic plan.
func SendBatch(ctx context.Context, db *gorm.DB, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	conn, err := poolConn(ctx, db)
	if err != nil {
		return err
	}
	defer conn.Close()
	var readErr error
	err = withPgx(conn, func(c *pgx.Conn) error {
		br := c.SendBatch(ctx, b)
		readErr = read(br)
		if cerr := br.Close(); readErr == nil {
			readErr = cerr
		}
		if c.IsClosed() || c.PgConn().TxStatus() != 'I' {
			return driver.ErrBadConn // database/sql discards the connection
		}
		return nil
	})
	if readErr != nil {
		return readErr
	}
	return err
}

// Begin sends BEGIN and query (placeholders $1, $2, ...) in one round trip and hands query's rows to scan.
// After an error the transaction is still open, or the connection broken: only Close may follow.
func (t *PipelinedTx) Begin(ctx context.Context, scan func(pgx.Rows) error, query string, args ...any) error {
	if t.state != txIdle {
		return errors.New("database: Begin on a transaction already begun")
	}
	t.state = txOpen
	return t.pipeline(ctx, func(c *pgx.Conn) error {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(query, args...)
		br := c.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		rows, err := br.Query()
		if err == nil {
			err = scan(rows)
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

// BeginWithNext queues BEGIN and query (placeholders $1, $2, ...) to be sent with the transaction's next
// statement, all in one round trip: the next statement is the one Query runs on DB, or Commit's. Any other
// statement through DB first sends BEGIN and query alone. query's rows, if any, are not read.
//
// If query fails in the database, the statements sent with it do not run (PostgreSQL skips the rest of a
// pipeline after an error), and the call that sent them returns an error matching query's (a *pgconn.PgError,
// with errors.As), which BeginErr returns too; the transaction is then aborted, and only Close may follow.
// begun, when set, runs once query has run and before the statement sent with it returns its rows to its
// caller (a crash test's failpoint); not when query went with Commit, which has ended the transaction. With
// an empty query BEGIN alone waits for the next statement: a transaction whose first statement is Query's
// spends no round trip on BEGIN.
func (t *PipelinedTx) BeginWithNext(begun func(), query string, args ...any) error {
	if t.state != txIdle {
		return errors.New("database: BeginWithNext on a transaction already begun")
	}
	t.state = txPending
	t.next = pendingBegin{query: query, args: args, begun: begun}
	return nil
}

// BeginErr is the database's error for the statement BeginWithNext queued, once it was sent and failed; nil
// before it is sent, or when it succeeded.
func (t *PipelinedTx) BeginErr() error { return t.beginErr }

// sendWithBegin sends BEGIN, the queued statement and then whatever queue adds, in one round trip, and hands the
// results of queue's statements to read. When the queued statement fails read is not called, and the error is
// the queued statement's, also kept for BeginErr.
func (t *PipelinedTx) sendWithBegin(ctx context.Context, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	next := t.next
	t.next, t.state = pendingBegin{}, txOpen
	err := t.pipeline(ctx, func(c *pgx.Conn) error {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		if next.query != "" {
			b.Queue(next.query, next.args...)
		}
		queue(b)
		br := c.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil && next.query != "" {
			if _, err = br.Exec(); err != nil {
				t.beginErr = err
			}
		}
		if err == nil && read != nil {
			err = read(br)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if t.beginErr != nil {
		return fmt.Errorf("database: the statement sent with BEGIN: %w", t.beginErr)
	}
	return err
}

// flushBegin sends a statement BeginWithNext queued, with BEGIN and nothing else: a statement that goes through
// gorm cannot travel with it. An error is the queued statement's (or the connection's).
func (t *PipelinedTx) flushBegin(ctx context.Context) error {
	if t.state != txPending {
		return t.beginErr
	}
	begun := t.next.begun
	if err := t.sendWithBegin(ctx, func(*pgx.Batch) {}, nil); err != nil {
		return err
	}
	if begun != nil {
		begun()
	}
	return nil
}

// queryWithBegin is Query's statement sent with t's BEGIN and queued statement, read with pgx: its rows never
// pass through database/sql, so they are mapped to T's fields here, by column name as gorm maps them (gorm's
// schema of T), or scanned into T itself when T is no struct gorm can map (one column).
func queryWithBegin[T any](db *gorm.DB, t *PipelinedTx, query string, args []any) ([]T, error) {
	stmt := db.Raw(query, args...).Statement // gorm renders the placeholders ($1, ...) and expands the arguments
	if stmt.Error != nil {
		return nil, stmt.Error
	}
	var sch *schema.Schema
	if err := stmt.Parse(new(T)); err == nil {
		sch = stmt.Schema
	} else if !errors.Is(err, schema.ErrUnsupportedDataType) {
		return nil, err
	}
	ctx := stmt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	begun := t.next.begun
	var out []T
	err := t.sendWithBegin(ctx, func(b *pgx.Batch) { b.Queue(stmt.SQL.String(), stmt.Vars...) }, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		var fields []*schema.Field
		if sch != nil {
			fields = columnFields(sch, rows.FieldDescriptions())
		}
		for rows.Next() {
			var v T
			dest := []any{&v}
			if sch != nil {
				dest = fieldsOf(ctx, fields, reflect.ValueOf(&v).Elem())
			}
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			out = append(out, v)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	if begun != nil {
		begun()
	}
	return out, nil
}

// columnFields is the field of sch that gorm maps each column to, nil for a column it maps to none.
func columnFields(sch *schema.Schema, cols []pgconn.FieldDescription) []*schema.Field {
	fields := make([]*schema.Field, len(cols))
	for i, col := range cols {
		if f := sch.LookUpField(col.Name); f != nil && f.Readable {
			fields[i] = f
		}
	}
	return fields
}

// fieldsOf is where each column of a row goes in v: its field (columnFields), or nowhere.
func fieldsOf(ctx context.Context, fields []*schema.Field, v reflect.Value) []any {
	dest := make([]any, len(fields))
	for i, f := range fields {
		if f != nil {
			dest[i] = f.ReflectValueOf(ctx, v).Addr().Interface()
		} else {
			dest[i] = new(any)
		}
	}
	return dest
}

// DB is the transaction as gorm sees it, for the statements between Begin and Commit: they run on the
// transaction's connection, and a nested Transaction on it is a savepoint. gorm's Commit and Rollback on it
// fail: the transaction ends with Commit or Close.
func (t *PipelinedTx) DB() *gorm.DB { return t.db }

// Commit sends query (placeholders $1, $2, ..., or none for a bare COMMIT) and COMMIT in one round trip, and
// returns the connection to the pool when they succeed.
// COMMIT runs unless query fails in the database, so query must fail whenever the transaction must not commit
// (a constraint, a deferred foreign key checked at COMMIT, a raised error): nothing in its result is looked at.
//
// An error that the database answered (a *pgconn.PgError) means nothing was committed. Any other error (the
// connection dropped or timed out after the pipeline left) leaves the outcome unknown: COMMIT may have run.
func (t *PipelinedTx) Commit(ctx context.Context, query string, args ...any) error {
	// The statements that end the transaction: query, if any, and COMMIT, read in that order.
	queue := func(b *pgx.Batch) {
		if query != "" {
			b.Queue(query, args...)
		}
		b.Queue("COMMIT")
	}
	read := func(br pgx.BatchResults) error {
		_, err := br.Exec()
		if err == nil && query != "" {
			_, err = br.Exec()
		}
		return err
	}
	var err error
	switch t.state {
	case txPending:
		err = t.sendWithBegin(ctx, queue, read)
	case txOpen:
		err = t.pipeline(ctx, func(c *pgx.Conn) error {
			if query == "" {
				_, err := c.Exec(ctx, "COMMIT")
				return err
			}
			b := &pgx.Batch{}
			queue(b)
			br := c.SendBatch(ctx, b)
			err := read(br)
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			return err
		})
	default:
		return errors.New("database: Commit on a transaction not begun")
	}
	if err == nil {
		t.state = txCommitted
		t.conn.Close()
	}
	return err
}

// Close ends the transaction: it rolls back one that did not commit, and returns the connection to the pool, or
// discards it when it cannot be brought back to the idle state. After a Commit that succeeded (which returned
// the connection already) it does nothing, so it can be deferred.
func (t *PipelinedTx) Close() {
	if t.state == txCommitted {
		return
	}
	if t.state == txOpen {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = t.pipeline(ctx, func(c *pgx.Conn) error {
			if c.PgConn().TxStatus() == 'I' {
				return nil // the failed COMMIT already ended it
			}
			_, err := c.Exec(ctx, "ROLLBACK")
			return err
		})
		cancel()
	}
	if t.state == txBroken {
		// Raw with driver.ErrBadConn makes database/sql close the connection instead of pooling it.
		_ = t.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	t.conn.Close()
}

// pipeline runs fn on the pgx connection under t's, and marks t broken when the connection is left closed or
// inside a transaction block nobody will end.
func (t *PipelinedTx) pipeline(ctx context.Context, fn func(*pgx.Conn) error) error {
	err := withPgx(t.conn, func(c *pgx.Conn) error {
		err := fn(c)
		if c.IsClosed() {
			t.state = txBroken
		}
		return err
	})
	var pgErr *pgconn.PgError
	if err != nil && !errors.As(err, &pgErr) && t.state == txOpen {
		// Not the database's answer (or no connection to ask): whatever the connection holds is not known, so
		// it is not reused.
		t.state = txBroken
	}
	return err
}

// withPgx runs fn on the pgx connection under conn, and returns fn's error, or database/sql's when there is no
// connection to run it on.
func withPgx(conn *sql.Conn, fn func(*pgx.Conn) error) error {
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("database: pipelining needs pgx's stdlib driver, not %T", dc)
		}
		return fn(sc.Conn())
	})
}

// txPool is the pipelined transaction's connection as a gorm.ConnPool. Its Commit and Rollback make gorm treat
// it as a transaction already open (a nested Transaction takes a savepoint), and refuse to end it. A statement
// through it first sends what BeginWithNext queued. It is used as a pointer: gorm checks it for nil with reflect.
type txPool struct {
	*sql.Conn
	t *PipelinedTx
}

func (p *txPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := p.t.flushBegin(ctx); err != nil {
		return nil, err
	}
	return p.Conn.ExecContext(ctx, query, args...)
}

func (p *txPool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := p.t.flushBegin(ctx); err != nil {
		return nil, err
	}
	return p.Conn.QueryContext(ctx, query, args...)
}

// QueryRowContext runs query even when the statement BeginWithNext queued failed: the transaction is aborted
// then, so query fails in the database, and its *sql.Row carries that error (only database/sql can make one).
func (p *txPool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	_ = p.t.flushBegin(ctx)
	return p.Conn.QueryRowContext(ctx, query, args...)
}

func (p *txPool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	if err := p.t.flushBegin(ctx); err != nil {
		return nil, err
	}
	return p.Conn.PrepareContext(ctx, query)
}

var (
	_ gorm.ConnPool    = (*txPool)(nil)
	_ gorm.TxCommitter = (*txPool)(nil)
)

var errPipelinedEnd = errors.New("database: a pipelined transaction ends with its Commit or Close")

func (*txPool) Commit() error   { return errPipelinedEnd }
func (*txPool) Rollback() error { return errPipelinedEnd }
