package database

import (
	"context"
	"database/sql"

	"gorm.io/gorm"
)

// DBTX is where the library's statements run, written with PostgreSQL's $n placeholders, which pgx's
// database/sql driver takes as they are: the pool (SQL of the *gorm.DB Open returns), a *sql.DB, *sql.Conn or
// *sql.Tx on pgx's driver, or the transaction of a Tx (SQL of Tx.Gorm). The name is sqlc's for the same set.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Pool is a DBTX that begins transactions, lends a connection of its own and can be pinged: the pool (PoolOf
// the *gorm.DB Open returns, which keeps Options' acquire bound on statements and transactions) or a *sql.DB.
type Pool interface {
	DBTX
	Beginner
	Conn(ctx context.Context) (*sql.Conn, error)
	PingContext(ctx context.Context) error
}

// Beginner begins transactions: a Pool, or a *sql.Conn of one.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// InTx runs fn in a transaction of db begun with opts (nil for the defaults): it commits when fn returns nil
// and rolls back when fn fails or panics.
func InTx(ctx context.Context, db Beginner, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, a no-op
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// SQL is what db's statements run on, as the library's packages take it: the pool under a *gorm.DB pool, or the
// transaction under a gorm transaction or Tx.Gorm.
func SQL(db *gorm.DB) DBTX { return db.Statement.ConnPool }

// PoolOf is the pool under db, a *gorm.DB pool that Check accepts, as the library's packages take it. A service
// converts its pool once, where it is wired.
func PoolOf(db *gorm.DB) (Pool, error) {
	pool, err := pgxPool(db)
	if err != nil {
		return nil, err
	}
	return pool.(Pool), nil
}

var (
	_ Pool     = (*sql.DB)(nil)
	_ Beginner = (*sql.Conn)(nil)
	_ Pool     = (*acquireBound)(nil)
	_ DBTX     = (*sql.Tx)(nil)
	_ DBTX     = (*txConn)(nil)
)

// ScanAll runs query with args on db and scans each row into a T by the pointers fields returns.
func ScanAll[T any](ctx context.Context, db DBTX, fields func(*T) []any, query string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(fields(&v)...); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
