// Package testdb gives tests a real PostgreSQL, fast: one lazily opened connection per package from
// TEST_DATABASE_URL, schemas migrated once and reused.
//
//   - Tx(t) is a transaction in the package's base schema, rolled back at cleanup: for tests that never need
//     another connection to see their writes.
//   - Schema(t) lends a whole migrated schema, emptied when lent, for tests that must commit: concurrency,
//     crash recovery, a server under test. Its DSN lets a subprocess connect to the same schema.
package testdb

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/retrysafe/retrysafe/migrations"
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
	// DSN connects to the same schema (search_path set), for a subprocess under test.
	DSN    string
	Schema string
}

var (
	mu   sync.Mutex
	free []*DB
	made int
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
	} else {
		made++
		name := fmt.Sprintf("%s_%d", packagePrefix(), made)
		mu.Unlock()
		var err error
		if db, err = open(name); err != nil {
			t.Fatalf("testdb: %v", err)
		}
		mu.Lock()
	}
	mu.Unlock()
	if err := truncate(db.DB); err != nil {
		t.Fatalf("testdb: empty schema %s: %v", db.Schema, err)
	}
	t.Cleanup(func() {
		mu.Lock()
		free = append(free, db)
		mu.Unlock()
	})
	return db
}

var (
	baseOnce sync.Once
	base     *DB
	baseErr  error
)

// Tx returns a transaction in the package's base schema that is rolled back when the test ends.
func Tx(t testing.TB) *gorm.DB {
	t.Helper()
	baseOnce.Do(func() { base, baseErr = open(packagePrefix() + "_base") })
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

func open(schema string) (*DB, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := sql.Open("pgx", URL())
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema); err != nil {
		return nil, fmt.Errorf("create schema %s (is PostgreSQL running at %s?): %w", schema, URL(), err)
	}
	dsn, err := withSearchPath(URL(), schema)
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
	if err := migrations.Up(ctx, sqlDB); err != nil {
		return nil, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return &DB{DB: db, DSN: dsn, Schema: schema}, nil
}

func truncate(db *gorm.DB) error {
	var tables []string
	err := db.Raw(`SELECT quote_ident(tablename) FROM pg_tables
WHERE schemaname = current_schema() AND tablename NOT LIKE 'goose%'`).Scan(&tables).Error
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

// packagePrefix names this test binary's schemas after the package and the checkout it runs in, so packages
// testing in parallel, and two checkouts testing at once, never share a schema.
func packagePrefix() string {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
	dir, _ := os.Getwd()
	sum := sha256.Sum256([]byte(dir))
	return "t_" + nonIdent.ReplaceAllString(strings.ToLower(name), "_") + "_" + hex.EncodeToString(sum[:3])
}

var emptyMade int

// EmptySchema creates a schema with nothing in it, not even migrations, and returns a DSN that uses it; it is
// dropped when the test ends. For tests of migrating and of readiness before migrations.
func EmptySchema(t testing.TB) string {
	t.Helper()
	mu.Lock()
	emptyMade++
	name := fmt.Sprintf("%s_empty_%d", packagePrefix(), emptyMade)
	mu.Unlock()
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
