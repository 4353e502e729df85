package opstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// The benchmark's floor of the store's own rows (internal/bench): the schema ceiling writes the rows a create
// and a retry leave in one statement each, with none of the store's work around them, and the growth run preloads
// the rows of completed creates. They are here because every statement on operations is; nothing else runs them.

var (
	ceilingCreateSQL    = statement("ceiling_create")
	ceilingStoredSQL    = statement("ceiling_stored")
	ceilingAttemptSQL   = statement("ceiling_attempt")
	benchPreloadSQL     = statement("bench_preload")
	benchVacuumSQL      = statement("bench_vacuum")
	benchRecordCountSQL = statement("bench_record_count")
)

// CeilingTicket is the ticket the schema ceiling's create writes beside its operation.
type CeilingTicket struct {
	ID, Project, Title, Priority string
	CreatedAt, UpdatedAt         time.Time
}

// CeilingCreate writes, in one statement, operation id of account holding key, completed with the stored
// response (header as JSON, body), its one event (detail as JSON) and ticket t; created false when another
// operation holds the key (nothing was written).
func CeilingCreate(ctx context.Context, db database.DBTX, accountID, id, key, fingerprint string, header string, body []byte,
	detail string, t CeilingTicket) (created bool, err error) {
	n, err := exec(ctx, db, ceilingCreateSQL, accountID, id, key, fingerprint, t.ID, header, body, detail,
		t.ID, t.Project, t.Title, t.Priority, t.CreatedAt, t.UpdatedAt)
	return n == 1, err
}

// CeilingStored is what the schema ceiling reads of the operation holding a key.
type CeilingStored struct {
	ID             string
	Fingerprint    string
	ResponseStatus int
	ResponseBody   []byte
}

// CeilingLookup reads the operation holding key of account; found false when none does.
func CeilingLookup(ctx context.Context, db database.DBTX, accountID, key string) (s CeilingStored, found bool, err error) {
	var fingerprint *string
	var status *int
	found, err = queryRow(ctx, db, ceilingStoredSQL, []any{accountID, key}, &s.ID, &fingerprint, &status, &s.ResponseBody)
	if fingerprint != nil {
		s.Fingerprint = *fingerprint
	}
	if status != nil {
		s.ResponseStatus = *status
	}
	return s, found, err
}

// CeilingAttempt records an attempt answered from operation id of account: an event of eventType, detail as
// JSON.
func CeilingAttempt(ctx context.Context, db database.DBTX, id, accountID, eventType, detail string) error {
	_, err := exec(ctx, db, ceilingAttemptSQL, id, accountID, eventType, detail)
	return err
}

// BenchPreload loads, on c, the completed ticket creates numbered [from, to) into a migrated retrysafe database,
// created from t0 on (sql/bench_preload.sql says which rows).
func BenchPreload(ctx context.Context, c *pgx.Conn, from, to int64, t0 time.Time) error {
	if _, err := c.Exec(ctx, `SELECT set_config('bench.from', $1, false), set_config('bench.to', $2, false), set_config('bench.t0', $3, false)`,
		strconv.FormatInt(from, 10), strconv.FormatInt(to, 10), t0.UTC().Format(time.RFC3339)); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, benchPreloadSQL); err != nil {
		return fmt.Errorf("preload %d..%d: %w", from, to, err)
	}
	return nil
}

// BenchVacuum vacuums and analyzes, on c, the store's tables, as autovacuum would have after a preload.
func BenchVacuum(ctx context.Context, c *pgx.Conn) error {
	_, err := c.Exec(ctx, benchVacuumSQL)
	return err
}

// BenchRecordCount returns, on c, how many events the store holds.
func BenchRecordCount(ctx context.Context, c *pgx.Conn) (n int64, err error) {
	err = c.QueryRow(ctx, benchRecordCountSQL).Scan(&n)
	return n, err
}
