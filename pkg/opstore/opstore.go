// Package opstore owns the operations and operation_events tables: every statement on them is a file in sql/,
// run by a typed function here. Other packages (idem, opstatus, the services, the audit, metrics, the benchmark)
// ask it; none reads those tables with SQL of its own.
//
// Records are types: an event's detail has one Go type per kind (Attempt, Link; a service's evidence has its
// own), written and read by the same types, and the columns the database reads of an attempt (attempt_id,
// outcome) are filled here from its type. The records' vocabulary, the event types and reason lists, is here too.
// Queries of other tables that show an operation's state read it with the SQL function operation_state.
//
// Functions take the handle their caller holds: a database.DBTX (the pool, a database/sql transaction, or a
// database.Tx's; database.SQL gives it for a *gorm.DB), whose statements run through pgx's database/sql driver
// with PostgreSQL's own $n placeholders (gorm would rewrite ? and read the jsonb ? operator as one), or a
// pgx.Batch (Queue* functions), sent with others in one round trip by database.Tx. The schema is
// migrations/00001_baseline.sql.
//
//	op, err := opstore.Get(ctx, db, accountID, id)       // ErrNotFound when the account has no such operation
//	err = opstore.Append(ctx, tx, accountID, id, opstore.NewEvent{Type: "observed", Actor: actor, Detail: d})
package opstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/retrysafe/retrysafe/pkg/database"
)

//go:embed sql/*.sql
var files embed.FS

// statement is the text of sql/<name>.sql.
func statement(name string) string {
	raw, err := files.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic("opstore: no statement " + name)
	}
	return string(raw)
}

var (
	lookupKeySQL         = statement("lookup_key")
	attemptKnownSQL      = statement("attempt_known")
	attemptRecordedSQL   = statement("attempt_recorded")
	claimedSupersedesSQL = statement("claimed_supersedes")
	lockKeySQL           = statement("lock_key")
	lockOperationSQL     = statement("lock_operation")
	shareOperationSQL    = statement("share_operation")
	supersededSQL        = statement("superseded")
	insertOperationSQL   = statement("insert_operation")
	insertEventsSQL      = statement("insert_events")
	completeSQL          = statement("complete")
	createCompletedSQL   = statement("create_completed")
	releaseSQL           = statement("release")
	pruneResponsesSQL    = statement("prune_responses")
	pruneKeysSQL         = statement("prune_keys")
	keyPredecessorSQL    = statement("key_predecessor")
	extendLeaseSQL       = statement("extend_lease")
	transitionSQL        = statement("transition")
	appendEventsSQL      = statement("append_events")
	getOperationSQL      = statement("get_operation")
	lockForDecisionSQL   = statement("lock_for_decision")
	byKeySQL             = statement("by_key")
	listSQL              = statement("list")
	listAfterSQL         = statement("list_after")
	listUnknownSQL       = statement("list_unknown")
	eventsSQL            = statement("events")
	countEventsSQL       = statement("count_events")
	lastDispatchSQL      = statement("last_dispatch")
	startDispatchSQL     = statement("start_dispatch")
	expireLeasesSQL      = statement("expire_leases")
	ownerGoneSQL         = statement("owner_gone")
	claimAttemptSQL      = statement("claim_attempt")
	priorSQL             = statement("prior")
	lockKindStateSQL     = statement("lock_kind_state")
	lastEventDetailSQL   = statement("last_event_detail")
	linkedNotFailedSQL   = statement("linked_not_failed")
	creatorSQL           = statement("creator")
	forResourceSQL       = statement("for_resource")
	accountOfSQL         = statement("account_of")
	unknownCountSQL      = statement("unknown_count")
	hasEventsSQL         = statement("has_events")
)

// ErrNotFound: the account has no such operation.
var ErrNotFound = errors.New("opstore: no such operation")

// ErrAlreadySettled: a completion or release found its operation no longer running under its key (another
// worker recorded its outcome, or released it), so nothing was written; the transaction failed with it, and
// PostgreSQL skipped whatever was sent after it, COMMIT included.
var ErrAlreadySettled = errors.New("opstore: operation already settled")

// settledState is the SQLSTATE of operation_settled's refusal (migrations/00001_baseline.sql).
const settledState = "RS001"

func exec(ctx context.Context, db database.DBTX, query string, args ...any) (int64, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, translate(err)
	}
	return res.RowsAffected()
}

// queryRow scans the one row of query into dest, reporting found false when there is none.
func queryRow(ctx context.Context, db database.DBTX, query string, args []any, dest ...any) (found bool, err error) {
	err = db.QueryRowContext(ctx, query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, translate(err)
}

// translate gives the store's refusals their sentinel, wrapping the driver's error.
func translate(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == settledState {
		return fmt.Errorf("%w: %w", ErrAlreadySettled, err)
	}
	return err
}

// isUnique reports whether err is a unique violation of constraint.
func isUnique(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == constraint
}

// KeyTaken reports whether err is a claim's failure on a key another operation of the account holds (the unique
// index operations_key).
func KeyTaken(err error) bool { return isUnique(err, "operations_key") }

// AttemptUsed reports whether err is the refusal of an attempt record whose attempt id its operation already has
// a record of (the unique index operation_events_attempt).
func AttemptUsed(err error) bool { return isUnique(err, "operation_events_attempt") }

// SuccessorTaken reports whether err is the refusal of a second superseded event of one operation (the unique
// index operation_events_successor).
func SuccessorTaken(err error) bool { return isUnique(err, "operation_events_successor") }

// Operation is a row of operations as read: State is the state's text, empty strings stand for NULL key and
// fingerprint, and ResourceType and ResourceID are both set or both nil.
type Operation struct {
	ID, AccountID, Kind, State      string
	IdempotencyKey, Fingerprint     string
	ResourceType, ResourceID        *string
	LeaseExpiresAt                  *time.Time
	ResponseExpiresAt, KeyExpiresAt *time.Time
	CreatedAt, UpdatedAt            time.Time
}

// scanner is a row of *sql.Rows or a *sql.Row.
type scanner interface{ Scan(dest ...any) error }

// scanOperation reads the columns of get_operation.sql, in its order.
func scanOperation(row scanner) (Operation, error) {
	var op Operation
	var key, fp *string
	err := row.Scan(&op.ID, &op.AccountID, &op.Kind, &op.State, &key, &fp, &op.ResourceType, &op.ResourceID,
		&op.LeaseExpiresAt, &op.CreatedAt, &op.UpdatedAt, &op.ResponseExpiresAt, &op.KeyExpiresAt)
	if key != nil {
		op.IdempotencyKey = *key
	}
	if fp != nil {
		op.Fingerprint = *fp
	}
	if op.ResourceType == nil || op.ResourceID == nil {
		op.ResourceType, op.ResourceID = nil, nil
	}
	return op, err
}

// operations runs query and reads its rows as operations.
func operations(ctx context.Context, db database.DBTX, query string, args ...any) ([]Operation, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	var ops []Operation
	for rows.Next() {
		op, err := scanOperation(rows)
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	return ops, rows.Err()
}

// one is the only operation of query, or ErrNotFound.
func one(ctx context.Context, db database.DBTX, query string, args ...any) (Operation, error) {
	ops, err := operations(ctx, db, query, args...)
	if err != nil {
		return Operation{}, err
	}
	if len(ops) == 0 {
		return Operation{}, ErrNotFound
	}
	return ops[0], nil
}

// stateText is a state for a nullable column: NULL for "".
func stateText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// seconds is d for an interval's `* interval '1 second'`.
func seconds(d time.Duration) float64 { return d.Seconds() }
