package database

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// UniqueViolation reports whether err is a unique constraint violation (SQLSTATE 23505), of the named
// constraint when constraint is not empty. It is the one place the driver's error type is read: callers above
// the store ask it, not pgconn.
func UniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return false
	}
	return constraint == "" || pgErr.ConstraintName == constraint
}
