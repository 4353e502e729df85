package database

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

// ErrUnavailable is matched (errors.Is) by every error this package returns for a database that is unavailable:
// it could not be reached, went away in the middle of a statement, or did not answer within a bound. It is the
// store failure package problem answers 503 store_unavailable.
var ErrUnavailable = problem.ErrStoreUnavailable

// UnavailableError is the error of a statement that did not run, or whose answer was lost, because the database
// is unavailable. Cause is what the driver said, kept for the log.
type UnavailableError struct{ Cause error }

func (e *UnavailableError) Error() string { return "database unavailable: " + e.Cause.Error() }

func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Cause} }

// unavailable is err as an UnavailableError when it says the database is unavailable (problem.IsStoreUnavailable),
// and err unchanged otherwise: the one place this package makes one.
func unavailable(err error) error {
	var already *UnavailableError
	if err == nil || errors.As(err, &already) || !problem.IsStoreUnavailable(err) {
		return err
	}
	return &UnavailableError{Cause: err}
}

// failedRow is a *sql.Row whose Scan returns err, for a QueryRowContext that cannot run its statement (a
// *sql.Row carries an error only from a query): the query of a pool whose every connection fails with err.
func failedRow(ctx context.Context, err error) *sql.Row {
	db := sql.OpenDB(failedConnector{err})
	defer db.Close()
	return db.QueryRowContext(context.WithoutCancel(ctx), "")
}

type failedConnector struct{ err error }

func (c failedConnector) Connect(context.Context) (driver.Conn, error) { return nil, c.err }
func (c failedConnector) Driver() driver.Driver                        { return c }
func (c failedConnector) Open(string) (driver.Conn, error)             { return nil, c.err }
