// Package database opens the gorm + PostgreSQL pool of a retrysafe process with bounds on every wait, so that a
// database that is gone, frozen or restarting turns into a prompt error (503 store_unavailable through package
// problem) instead of a request that hangs until the caller gives up and retries blind.
//
//	db, err := database.Open(dsn, database.Options{MaxConns: 20, ConnectTimeout: 3 * time.Second,
//		AcquireTimeout: 3 * time.Second, StatementTimeout: 5 * time.Second})
//
// Three waits are bounded: connecting (the TCP connection and the startup handshake), getting a connection
// from the pool when every one is busy, and each statement (from sending it to the last byte of its answer,
// enforced by the client, so a frozen server is noticed too; the server gets the same statement_timeout so it
// stops working on a statement nobody waits for).
//
// Tx is the transaction the idempotency library runs a write in: its own statements through pgx, the write's
// through gorm, on one connection.
package database

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"
)

// Options bound the pool. A zero duration leaves that wait unbounded.
type Options struct {
	MaxConns         int
	ConnectTimeout   time.Duration
	AcquireTimeout   time.Duration
	StatementTimeout time.Duration
	// MaxIdleTime closes connections idle for longer (5 minutes when zero).
	MaxIdleTime time.Duration
}

// Open returns a pool on dsn (a postgres:// URL). It does not connect: the first statement does.
func Open(dsn string, o Options) (*gorm.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if o.ConnectTimeout > 0 {
		cfg.ConnectTimeout = o.ConnectTimeout
	}
	if o.StatementTimeout > 0 {
		if cfg.RuntimeParams == nil {
			cfg.RuntimeParams = map[string]string{}
		}
		cfg.RuntimeParams["statement_timeout"] = strconv.FormatInt(o.StatementTimeout.Milliseconds(), 10)
		dial := cfg.DialFunc
		if dial == nil {
			dial = (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext
		}
		// The client-side bound is a little longer than the server's, so that a statement the server gives up on
		// is reported by the server (SQLSTATE 57014) and only a server that does not answer at all is cut here.
		bound := o.StatementTimeout + o.StatementTimeout/5 + 100*time.Millisecond
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &boundedConn{Conn: c, bound: bound}, nil
		}
	}
	sqlDB := stdlib.OpenDB(*cfg)
	max := o.MaxConns
	if max <= 0 {
		max = 10
	}
	sqlDB.SetMaxOpenConns(max)
	sqlDB.SetMaxIdleConns(max)
	idle := o.MaxIdleTime
	if idle <= 0 {
		idle = 5 * time.Minute
	}
	sqlDB.SetConnMaxIdleTime(idle)
	var pool gorm.ConnPool = sqlDB
	if o.AcquireTimeout > 0 {
		pool = &acquireBound{DB: sqlDB, timeout: o.AcquireTimeout}
	}
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: pool}), &gorm.Config{
		Logger:                 gormlogger.Discard,
		SkipDefaultTransaction: true,
		DisableAutomaticPing:   true, // a process starts while its database is down; readiness tells
	})
	if err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	return db, nil
}

// boundedConn gives every answer a deadline counted from the request that asks for it: each write to the
// server moves the read deadline to now+bound. An idle connection has no pending read and is never cut.
type boundedConn struct {
	net.Conn
	bound time.Duration
}

func (c *boundedConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.bound)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// acquireBound is the pool as gorm sees it, with a bound on waiting for a free connection: database/sql waits
// for one as long as the context lets it, and a request context has no deadline. When the pool is full it
// reserves a connection with its own deadline first, then runs the statement on it with the caller's context.
// While a connection is idle or may still be opened (bounded by the connect timeout) it goes straight to the
// pool: the reservation costs about as much as the round trip itself. Two statements racing for the last idle
// connection may leave one waiting unbounded, but then only for a statement to finish, which the statement
// timeout bounds.
type acquireBound struct {
	*sql.DB
	timeout time.Duration
}

// full reports whether a statement would have to wait for a connection.
func (p *acquireBound) full() bool {
	st := p.DB.Stats()
	return st.Idle == 0 && st.OpenConnections >= st.MaxOpenConnections
}

var (
	_ gorm.ConnPool   = (*acquireBound)(nil)
	_ gorm.TxBeginner = (*acquireBound)(nil)
)

func (p *acquireBound) conn(ctx context.Context) (*sql.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	c, err := p.DB.Conn(actx)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		return nil, fmt.Errorf("database: no free connection within %s: %w", p.timeout, err)
	}
	return c, err
}

// release returns c to the pool once whatever still reads from it (rows, a transaction) is done: sql.Conn.Close
// waits for that.
func release(c *sql.Conn) { go c.Close() }

func (p *acquireBound) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if !p.full() {
		return p.DB.ExecContext(ctx, query, args...)
	}
	c, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ExecContext(ctx, query, args...)
}

func (p *acquireBound) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if !p.full() {
		return p.DB.QueryContext(ctx, query, args...)
	}
	c, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := c.QueryContext(ctx, query, args...)
	release(c)
	return rows, err
}

func (p *acquireBound) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if !p.full() {
		return p.DB.QueryRowContext(ctx, query, args...)
	}
	c, err := p.conn(ctx)
	if err != nil {
		// A *sql.Row carries an error only from a query: this one, on a context already past its deadline, fails
		// at Scan with context.DeadlineExceeded, which is a store failure as the acquire timeout is.
		expired, cancel := context.WithDeadline(ctx, time.Time{})
		defer cancel()
		return p.DB.QueryRowContext(expired, query, args...)
	}
	row := c.QueryRowContext(ctx, query, args...)
	release(c)
	return row
}

func (p *acquireBound) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return p.DB.PrepareContext(ctx, query)
}

func (p *acquireBound) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	if !p.full() {
		return p.DB.BeginTx(ctx, opts)
	}
	c, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := c.BeginTx(ctx, opts)
	release(c)
	return tx, err
}

// Ping lets readiness checks reach the pool through gorm's DB().
func (p *acquireBound) PingContext(ctx context.Context) error { return p.DB.PingContext(ctx) }

// GetDBConn is how gorm's DB() finds the *sql.DB under a wrapped pool.
func (p *acquireBound) GetDBConn() (*sql.DB, error) { return p.DB, nil }

// Query runs a statement on db (a pool or a transaction) and reads every row into a T, by column name as gorm
// maps them. It is gorm's Raw(...).Scan(&rows) without the cost Scan adds to every call: Scan records the
// statement with its arguments rendered into SQL text (for its logger, even a discarding one), which was a
// tenth of a write's CPU in the service; Rows and ScanRows do not.
func Query[T any](db *gorm.DB, sql string, args ...any) ([]T, error) {
	rows, err := db.Raw(sql, args...).Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := db.ScanRows(rows, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
