// Package testdb gives tests a real PostgreSQL, fast: one lazily opened connection per package from
// TEST_DATABASE_URL, schemas migrated once and reused.
//
// Nothing has to exist beforehand but a reachable server: the database of TEST_DATABASE_URL is created when it
// is missing. Schemas are named after the test package and the migrations' digest, and each one in use is held
// by a session advisory lock of this process, so the next run of the package reuses them (no pile of schemas
// per clone), two test processes never share one, and schemas of an older migration set that nobody holds are
// dropped.
//
//   - Tx(t) is a transaction in the package's base schema, rolled back at cleanup: for tests that never need
//     another connection to see their writes.
//   - Schema(t) lends a whole migrated schema, emptied when lent, for tests that must commit: concurrency,
//     crash recovery, a server under test. Its DSN lets a subprocess connect to the same schema. When the test
//     ends, its schema's audit record is verified (audit.Verify, what `retrysafe audit verify` runs): a test
//     whose traffic leaves a broken chain fails, unless it breaks the record on purpose and says so (Tampered).
package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/schema"
)

// DefaultURL is used when TEST_DATABASE_URL is unset: the local PostgreSQL of the development machine.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL is the database tests use.
func URL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is a lent schema.
type DB struct {
	*gorm.DB
	// Pool is the same pool as the library's packages take it.
	Pool *sql.DB
	// DSN connects to the same schema (search_path set), for a subprocess under test.
	DSN    string
	Schema string

	tampered bool
}

// Tampered says the test breaks the schema's audit record on purpose (a tampering test), so it is not verified
// when the test ends.
func (db *DB) Tampered() { db.tampered = true }

var (
	mu   sync.Mutex
	free []*DB
)

// MaxConnsPerSchema is the pool size of each lent schema; keep the sum modest on a 2-core machine.
const MaxConnsPerSchema = 12

// Schema lends a migrated, empty schema until the test ends.
func Schema(t testing.TB) *DB {
	t.Helper()
	mu.Lock()
	var db *DB
	if n := len(free); n > 0 {
		db, free = free[n-1], free[:n-1]
		mu.Unlock()
	} else {
		mu.Unlock()
		name, err := claimName(packagePrefix() + "_")
		if err == nil {
			db, err = open(name)
		}
		if err != nil {
			t.Fatalf("testdb: %v", err)
		}
	}
	if err := truncate(db.DB); err != nil {
		t.Fatalf("testdb: empty schema %s: %v", db.Schema, err)
	}
	db.tampered = false
	t.Cleanup(func() {
		// Cleanups run last in, first out: whatever the test started after lending (servers, processes) has
		// stopped writing by now.
		if !db.tampered && !t.Failed() {
			if err := AuditIntact(db.DB); err != nil {
				t.Errorf("testdb: the test's traffic left schema %s with %v; a test that breaks it on purpose calls Tampered",
					db.Schema, err)
			}
		}
		mu.Lock()
		free = append(free, db)
		mu.Unlock()
	})
	return db
}

// SealAll runs s until no audit record of its database is left unsealed, and returns the seals it wrote. A
// transaction open anywhere on the server (another test's) holds sealing back until it ends, hence the loop; a
// minute without getting there fails the test.
func SealAll(t testing.TB, s *audit.Sequencer) []auditchain.Seal {
	t.Helper()
	ctx := context.Background()
	var out []auditchain.Seal
	deadline := time.Now().Add(time.Minute)
	for {
		seal, err := s.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if seal != nil {
			out = append(out, *seal)
			continue
		}
		n, _, err := audit.Pending(ctx, s.DB)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("testdb: %d audit records still unsealed after a minute", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AuditIntact returns an error naming what `retrysafe audit verify` finds wrong with db's audit record (records
// and seals), or nil when it is intact. Records not sealed yet are not wrong.
func AuditIntact(db *gorm.DB) error {
	pool, err := database.PoolOf(db)
	if err != nil {
		return err
	}
	rep, err := audit.Verify(context.Background(), pool, audit.VerifyOptions{})
	switch {
	case err != nil:
		return fmt.Errorf("audit verify: %w", err)
	case !rep.Intact():
		return fmt.Errorf("audit record broken (%d problems), first: %+v", len(rep.Problems), rep.Problems[0])
	}
	return nil
}

var (
	baseOnce sync.Once
	base     *DB
	baseErr  error
)

// Tx returns a transaction in the package's base schema that is rolled back when the test ends.
func Tx(t testing.TB) *gorm.DB {
	t.Helper()
	baseOnce.Do(func() {
		var name string
		if name, baseErr = claimName(packagePrefix() + "_base_"); baseErr == nil {
			base, baseErr = open(name)
		}
	})
	if baseErr != nil {
		t.Fatalf("testdb: %v", baseErr)
	}
	tx := base.Begin()
	if tx.Error != nil {
		t.Fatalf("testdb: begin: %v", tx.Error)
	}
	t.Cleanup(func() { tx.Rollback() })
	return tx
}

// The session that holds this process's schema locks, for as long as the process lives.
var (
	holderOnce sync.Once
	holder     *sql.Conn
	holderErr  error
	// held are the names this process claimed: advisory locks are re-entrant within one session, so the lock
	// alone would hand a name to two tests of this process.
	heldMu sync.Mutex
	held   = map[string]bool{}
)

// lockClass namespaces testdb's advisory locks (pg_try_advisory_lock(class, hashtext(schema))).
const lockClass = 0x7274

// claimName takes the advisory lock of the first free schema name prefix1, prefix2, ... and returns it; the
// schema may already exist from an earlier run, to be reused.
func claimName(prefix string) (string, error) {
	holderOnce.Do(func() { holder, holderErr = openHolder() })
	if holderErr != nil {
		return "", holderErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	heldMu.Lock()
	defer heldMu.Unlock()
	for n := 1; n <= 200; n++ {
		name := fmt.Sprintf("%s%d", prefix, n)
		if held[name] {
			continue
		}
		var got bool
		if err := holder.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, lockClass, name).Scan(&got); err != nil {
			return "", fmt.Errorf("lock schema %s: %w", name, err)
		}
		if got {
			held[name] = true
			return name, nil
		}
	}
	return "", fmt.Errorf("no free schema named %s1..200", prefix)
}

// openHolder connects, creating the test database if it is missing, and drops the schemas that a test process
// made for another set of migrations and that no process holds now.
func openHolder() (*sql.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := ensureDatabase(ctx); err != nil {
		return nil, err
	}
	db, err := sql.Open("pgx", URL())
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect (is PostgreSQL running at %s?): %w", redact(URL()), err)
	}
	rows, err := conn.QueryContext(ctx, `SELECT nspname FROM pg_namespace WHERE nspname ~ '^t_.*_m[0-9a-f]{8}_'`)
	if err != nil {
		return nil, err
	}
	var stale []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, err
		}
		if !strings.Contains(name, "_m"+schema.Digest()+"_") {
			stale = append(stale, name)
		}
	}
	rows.Close()
	for _, name := range stale {
		var got bool
		if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, lockClass, name).Scan(&got); err != nil || !got {
			continue // another process uses it
		}
		_, _ = conn.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+quoteIdent(name)+` CASCADE`)
		_, _ = conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, lockClass, name)
	}
	return conn, nil
}

// ensureDatabase creates the database of URL() when the server says it does not exist.
func ensureDatabase(ctx context.Context) error {
	probe, err := sql.Open("pgx", URL())
	if err != nil {
		return fmt.Errorf("TEST_DATABASE_URL: %w", err)
	}
	defer probe.Close()
	err = probe.PingContext(ctx)
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		return nil // reachable, or a failure the first real query reports
	}
	u, err := url.Parse(URL())
	if err != nil {
		return err
	}
	name := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	admin, err := sql.Open("pgx", u.String())
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE `+quoteIdent(name)); err != nil {
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" {
			return nil // another test process created it first
		}
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

func quoteIdent(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(TEST_DATABASE_URL)"
	}
	return u.Redacted()
}

func open(name string) (*DB, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := sql.Open("pgx", URL())
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+name); err != nil {
		return nil, fmt.Errorf("create schema %s (is PostgreSQL running at %s?): %w", name, redact(URL()), err)
	}
	dsn, err := withSearchPath(URL(), name)
	if err != nil {
		return nil, err
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: gormlogger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(MaxConnsPerSchema)
	sqlDB.SetMaxIdleConns(MaxConnsPerSchema)
	if err := schema.Up(ctx, sqlDB); err != nil {
		return nil, fmt.Errorf("migrate schema %s: %w", name, err)
	}
	return &DB{DB: db, Pool: sqlDB, DSN: dsn, Schema: name}, nil
}

func truncate(db *gorm.DB) error {
	var tables []string
	// Not the records of applied migrations: the library's (goose_db_version) and the demo services'.
	err := db.Raw(`SELECT quote_ident(tablename) FROM pg_tables
WHERE schemaname = current_schema() AND tablename NOT LIKE 'goose%' AND tablename <> ?`, schema.VersionTable).Scan(&tables).Error
	if err != nil || len(tables) == 0 {
		return err
	}
	return db.Exec(`TRUNCATE ` + strings.Join(tables, ", ") + ` RESTART IDENTITY CASCADE`).Error
}

func withSearchPath(dsn, schema string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("TEST_DATABASE_URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// packagePrefix names this test binary's schemas after the package and the migrations they hold; the advisory
// locks of claimName keep two processes (two checkouts testing at once) apart.
func packagePrefix() string {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
	return "t_" + nonIdent.ReplaceAllString(strings.ToLower(name), "_") + "_m" + schema.Digest()
}

// EmptySchema creates a schema with nothing in it, not even migrations, and returns a DSN that uses it; it is
// dropped when the test ends (or, if the process dies first, by a later run). For tests of migrating and of
// readiness before migrations.
func EmptySchema(t testing.TB) string {
	t.Helper()
	name, err := claimName(packagePrefix() + "_empty_")
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	admin, err := sql.Open("pgx", URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(`DROP SCHEMA IF EXISTS ` + name + ` CASCADE; CREATE SCHEMA ` + name); err != nil {
		t.Fatalf("testdb: empty schema: %v", err)
	}
	t.Cleanup(func() {
		if admin, err := sql.Open("pgx", URL()); err == nil {
			_, _ = admin.Exec(`DROP SCHEMA IF EXISTS ` + name + ` CASCADE`)
			admin.Close()
		}
	})
	dsn, err := withSearchPath(URL(), name)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// CreateOperation inserts op with its claimed event by actor "test", as a claim does (opstore.QueueCreate), on
// db: a pool, a lent schema or a test's transaction.
func CreateOperation(t testing.TB, db *gorm.DB, op opstatus.Operation) {
	t.Helper()
	b := &pgx.Batch{}
	n := opstore.New{ID: op.ID, AccountID: op.AccountID, Kind: op.Kind, State: string(op.State),
		IdempotencyKey: op.IdempotencyKey, Fingerprint: op.Fingerprint, LeaseExpiresAt: op.LeaseExpiresAt}
	if r := op.Resource; r != nil {
		n.ResourceType, n.ResourceID = &r.Type, &r.ID
	}
	err := opstore.QueueCreate(b, n, []opstore.NewEvent{{Type: opstore.EventClaimed, To: string(op.State), Actor: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range b.QueuedQueries {
		if _, err := db.Statement.ConnPool.ExecContext(t.Context(), q.SQL, q.Arguments...); err != nil {
			t.Fatalf("create operation %s: %v", op.ID, err)
		}
	}
}

// Pool is db, a pool, as the library's packages take it.
func Pool(t testing.TB, db *gorm.DB) database.Pool {
	t.Helper()
	pool, err := database.PoolOf(db)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}
