package problem

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// IsStoreUnavailable reports whether err means the database could not be reached, went away mid-request, or
// did not answer within a bound, as opposed to a query the database refused. It reads the driver's error types
// (pgconn, database/sql, net); no message text is compared.
func IsStoreUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, ErrStoreUnavailable):
		return true
	case errors.As(err, &connectErr):
		// Whatever the server said while refusing the connection (3D000: the database is missing or was
		// dropped; 28P01: a password changed), no statement of this request can run now.
		return true
	case errors.As(err, &pgErr):
		return unavailableState(pgErr.Code)
	case errors.As(err, &netErr):
		return true
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		// The server closed the connection in the middle of an answer (restart, crash, a cut network).
		return true
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone), errors.Is(err, puddle.ErrClosedPool):
		return true
	case pgconn.SafeToRetry(err), pgconn.Timeout(err), errors.Is(err, context.DeadlineExceeded):
		// SafeToRetry: the statement never left (a closed or broken connection); Timeout: a bound ran out.
		return true
	}
	return false
}

// unavailableState reports whether a SQLSTATE means the server cannot serve now rather than that the statement
// is wrong: class 08 (connection exception), 53300 (too many connections), 57014 (statement_timeout cancelled
// it), 57P01-57P05 (admin or crash shutdown, cannot connect now, database dropped, idle session timeout) and
// 25P03 (idle in transaction timeout).
func unavailableState(code string) bool {
	if len(code) != 5 {
		return false
	}
	if code[:2] == "08" {
		return true
	}
	switch code {
	case "53300", "57014", "57P01", "57P02", "57P03", "57P04", "57P05", "25P03":
		return true
	}
	return false
}

// IsUnstorableText reports whether the database refused a value as text: NUL or invalid UTF-8 (SQLSTATE
// 22021 character_not_in_repertoire, 22P05 untranslatable_character). It is a request error, never a 500.
func IsUnstorableText(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "22021" || pgErr.Code == "22P05")
}

// IsUniqueViolation reports whether err is a unique constraint violation, optionally of the named constraint.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return false
	}
	return constraint == "" || pgErr.ConstraintName == constraint
}
