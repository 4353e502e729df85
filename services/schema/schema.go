// Package schema migrates the database of this repository's demo services: the library's tables (package
// migrations), then the tables of tickets, payments and deploys, a goose sequence of its own recorded in
// retrysafe_demo_version. `retrysafe migrate`, `retrysafe serve` (MIGRATE_ON_START) and internal/testdb use
// it; a service that only uses the library runs migrations.Up and its own migrations.
//
// A database that the single sequence migrated (the library's files and the demo ones, testdata/unsplit, together, up
// to version 17) has the demo tables already, exactly as this sequence's first files create them (the tests
// compare the catalogs). When its library version is 17 or more, Up records those files as applied without
// running them (a baseline); demo tables at an older version are refused, with what to run.
package schema

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/retrysafe/retrysafe/migrations"
)

//go:embed *.sql
var files embed.FS

// VersionTable records the applied demo migrations, as goose_db_version does the library's.
const VersionTable = "retrysafe_demo_version"

// unsplitVersion is the library version at which the single sequence ended: a database at it or above, migrated
// by that sequence, holds the demo tables exactly as baselineVersions create them.
const unsplitVersion = 17

// baselineVersions are the demo files that describe the demo tables at unsplitVersion; files added after them
// change that schema and run on every database.
var baselineVersions = []int64{1, 2, 3}

// Tables are the demo services' tables, the ones this sequence creates.
var Tables = []string{
	"tickets", "ticket_comments", "ticket_status_changes",
	"payment_intents", "payment_refunds",
	"environments", "deploys", "environment_locks", "deploy_accounts", "deploy_target_activations", "deploy_target_fences",
}

// Up applies the library's migrations and then the demo services' that the database has not seen yet.
func Up(ctx context.Context, db *sql.DB) error {
	if err := baseline(ctx, db); err != nil {
		return err
	}
	if err := migrations.Up(ctx, db); err != nil {
		return err
	}
	p, err := provider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("schema: up: %w", err)
	}
	return nil
}

// Pending reports whether some migration, the library's or the demo services', has not been applied; /readyz
// uses it. It never creates the demo version table (goose's HasPending would): the baseline of Up looks for it.
func Pending(ctx context.Context, db *sql.DB) (bool, error) {
	if pending, err := migrations.Pending(ctx, db); err != nil || pending {
		return pending, err
	}
	s, err := store(VersionTable)
	if err != nil {
		return false, err
	}
	exists, err := s.TableExists(ctx, db)
	if err != nil {
		return false, fmt.Errorf("schema: pending: %w", err)
	}
	if !exists {
		return true, nil
	}
	p, err := provider(db)
	if err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("schema: pending: %w", err)
	}
	return pending, nil
}

// ErrOldSchema is returned by Up for a database with the demo tables but without the demo version table, whose
// library migrations stopped before unsplitVersion.
var ErrOldSchema = errors.New("schema: the demo tables predate the split of the migrations")

// tablesPresent is true when any of the given tables exists in the current schema.
const tablesPresent = `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = ANY($1))`

// baseline records baselineVersions as applied when the demo tables are there already, made by the single
// sequence, and the demo version table is missing or empty. It holds goose's advisory lock meanwhile, the one
// every migration run here takes, so a replica that starts at the same time waits and then finds the record.
func baseline(ctx context.Context, db *sql.DB) error {
	demo, err := store(VersionTable)
	if err != nil {
		return err
	}
	library, err := store(goose.DefaultTablename)
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("schema: baseline: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lock.DefaultLockID); err != nil {
		return fmt.Errorf("schema: baseline: %w", err)
	}
	recorded, err := demo.TableExists(ctx, tx)
	if err != nil {
		return fmt.Errorf("schema: baseline: %w", err)
	}
	if recorded {
		applied, err := demo.ListMigrations(ctx, tx)
		if err != nil {
			return fmt.Errorf("schema: baseline: %w", err)
		}
		for _, m := range applied {
			if m.Version > 0 && m.IsApplied {
				return nil // the sequence has run here: goose takes it from there
			}
		}
	}
	var present bool
	if err := tx.QueryRowContext(ctx, tablesPresent, Tables).Scan(&present); err != nil {
		return fmt.Errorf("schema: baseline: %w", err)
	}
	if !present {
		return nil // a new database: the sequence creates them
	}
	version := int64(0)
	if ok, err := library.TableExists(ctx, tx); err != nil {
		return fmt.Errorf("schema: baseline: %w", err)
	} else if ok {
		if version, err = library.GetLatestVersion(ctx, tx); err != nil && !errors.Is(err, database.ErrVersionNotFound) {
			return fmt.Errorf("schema: baseline: %w", err)
		}
	}
	if version < unsplitVersion {
		return fmt.Errorf("%w: this database has the demo services' tables, but its migrations stopped at version %d, "+
			"before %d: migrate it to %d with the retrysafe of commit 22b767d (git checkout 22b767d && make build && "+
			"bin/retrysafe migrate), or drop the demo tables, then run this migrate again", ErrOldSchema, version,
			unsplitVersion, unsplitVersion)
	}
	if !recorded {
		if err := demo.CreateVersionTable(ctx, tx); err != nil {
			return fmt.Errorf("schema: baseline: %w", err)
		}
		if err := demo.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
			return fmt.Errorf("schema: baseline: %w", err)
		}
	}
	for _, v := range baselineVersions {
		if err := demo.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return fmt.Errorf("schema: baseline: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("schema: baseline: %w", err)
	}
	return nil
}

// store is goose's record of applied migrations in table.
func store(table string) (database.StoreExtender, error) {
	s, err := database.NewStore(database.DialectPostgres, table)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	ext, ok := s.(database.StoreExtender)
	if !ok {
		return nil, errors.New("schema: goose's PostgreSQL store cannot tell whether its table exists")
	}
	return ext, nil
}

func provider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	return p, nil
}

// Digest is a short hash of every migration file, the library's and the demo services': two databases migrated
// by binaries with the same Digest have the same schema. Test schemas are named with it (internal/testdb).
func Digest() string {
	sum := sha256.New()
	sum.Write([]byte(migrations.Digest()))
	names, _ := fs.Glob(files, "*.sql")
	for _, name := range names {
		raw, _ := files.ReadFile(name)
		fmt.Fprintf(sum, "%s %d\n", name, len(raw))
		sum.Write(raw)
	}
	return hex.EncodeToString(sum.Sum(nil))[:8]
}
