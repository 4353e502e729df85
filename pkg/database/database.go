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
//
// The library's packages take the database as database/sql on pgx's driver, not as gorm: a DBTX where a statement
// runs (the pool, a transaction), a Pool where they begin transactions of their own. A service converts the pool
// it opened once, where it is wired (PoolOf); a write holding a gorm transaction passes SQL(tx).
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
		cfg.RuntimeParams["statement_timeout"] = strconv.FormatInt(o.StatementTimeout.Milliseconds(), 10)
		dial := cfg.DialFunc
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
// as long as the context lets it, and a request context has no deadline. When the pool is full a statement first
// reserves a connection within the bound, then runs on it with the caller's context; otherwise it goes straight
// to the pool (a reservation costs about a round trip). Two statements racing for the last idle connection may
// leave one waiting for a statement to finish, which the statement timeout bounds.
type acquireBound struct {
	*sql.DB
	timeout time.Duration
}

func (p *acquireBound) conn(ctx context.Context) (*sql.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	c, err := p.DB.Conn(actx)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		return nil, &UnavailableError{Cause: fmt.Errorf("no free connection within %s: %w", p.timeout, err)}
	}
	return c, unavailable(err)
}

// runner is what a statement runs on: the pool, or a connection reserved from it.
type runner interface {
	gorm.ConnPool
	gorm.TxBeginner
}

var _ runner = (*acquireBound)(nil)

// on is where a statement runs: the pool when it has a connection to spare, else c, a connection reserved
// within the bound.
func (p *acquireBound) on(ctx context.Context) (on runner, c *sql.Conn, err error) {
	if st := p.DB.Stats(); st.Idle > 0 || st.OpenConnections < st.MaxOpenConnections {
		return p.DB, nil, nil
	}
	c, err = p.conn(ctx)
	return c, c, err
}

// release returns c, when reserved, to the pool once whatever still reads from it (rows, a transaction) is
// done: sql.Conn.Close waits for that.
func release(c *sql.Conn) {
	if c != nil {
		go c.Close()
	}
}

func (p *acquireBound) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	on, c, err := p.on(ctx)
	if err != nil {
		return nil, err
	}
	if c != nil {
		defer c.Close()
	}
	return on.ExecContext(ctx, query, args...)
}

func (p *acquireBound) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	on, c, err := p.on(ctx)
	if err != nil {
		return nil, err
	}
	defer release(c)
	return on.QueryContext(ctx, query, args...)
}

func (p *acquireBound) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	on, c, err := p.on(ctx)
	if err != nil {
		return failedRow(ctx, err)
	}
	defer release(c)
	return on.QueryRowContext(ctx, query, args...)
}

func (p *acquireBound) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	on, c, err := p.on(ctx)
	if err != nil {
		return nil, err
	}
	defer release(c)
	return on.BeginTx(ctx, opts)
}

// GetDBConn is how gorm's DB() finds the *sql.DB under a wrapped pool.
func (p *acquireBound) GetDBConn() (*sql.DB, error) { return p.DB, nil }
