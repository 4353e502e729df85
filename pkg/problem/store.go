package problem

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
)

// IsStoreUnavailable reports whether err means the database could not be reached, went away mid-request, or
// did not answer within a bound, as opposed to a query the database refused. It reads errors through the types
// of the standard library (net, io, database/sql) and the methods drivers share (SQLState, SafeToRetry), so it
// imports no driver; no message text is compared.
func IsStoreUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	var retryable interface{ SafeToRetry() bool }
	switch {
	case errors.Is(err, ErrStoreUnavailable):
		return true
	case sqlState(err) != "":
		return unavailableState(sqlState(err))
	case errors.As(err, &netErr):
		return true
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return true
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone):
		return true
	case errors.As(err, &retryable) && retryable.SafeToRetry(), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return false
}

// sqlState is the SQLSTATE the database answered err with, or "" when err holds none.
func sqlState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}

// unavailableState reports whether a SQLSTATE means the server cannot serve now rather than that the statement
// is wrong: class 08 (connection exception), 53300 (too many connections), 57014 (statement_timeout cancelled
// it), 57P01-57P05 (admin or crash shutdown, cannot connect now, database dropped, idle session timeout),
// 25P03 (idle in transaction timeout), and what a server answers a new connection it will not serve: 3D000
// (the database does not exist, or no longer) and class 28 (the credentials are refused).
func unavailableState(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "08", "28":
		return true
	}
	switch code {
	case "53300", "57014", "57P01", "57P02", "57P03", "57P04", "57P05", "25P03", "3D000":
		return true
	}
	return false
}

// isUnstorableText reports whether the database refused a value as text: NUL or invalid UTF-8 (SQLSTATE
// 22021 character_not_in_repertoire, 22P05 untranslatable_character). It is a request error, never a 500.
func isUnstorableText(err error) bool {
	state := sqlState(err)
	return state == "22021" || state == "22P05"
}
