// Package migrations embeds the library's tables (operations, which hold their idempotency keys, and their events,
// approvals, the audit records' seals, console sessions) and applies them with goose. The demo services' tables
// are not here: services/schema applies them after these.
//
// Every file is plain SQL with goose annotations, numbered in the order it applies; 00001_baseline creates the
// tables as the first release has them. goose records the files applied in its default table, goose_db_version.
// A service that uses the library migrates its database in one of three ways:
//
//   - from Go, at start: Up(ctx, sqlDB). It takes goose's PostgreSQL advisory lock, so replicas that start at
//     once migrate one at a time. Its record is goose_db_version: a service whose own goose migrations use that
//     table moves them to another (goose -table, goose.WithTableName), or their versions would mix.
//   - with the service's own goose: FS holds the files, for goose.NewProvider(goose.DialectPostgres, sqlDB,
//     migrations.FS) (any table name), or `goose -dir migrations postgres "$DATABASE_URL" up` on a checkout of
//     the repository at the version the service builds with.
//   - with golang-migrate: not as they are; see below.
//
// golang-migrate wants NNNNN_name.up.sql and NNNNN_name.down.sql pairs. Split each file at its "-- +goose Down"
// line (golang-migrate sends a file whole, and PostgreSQL reads the goose annotations as comments), then
// migrate; it records only the last version applied, in its own schema_migrations, so a database migrated by
// one tool is not handed to the other as it is:
//
//	mkdir gm && for f in migrations/*.sql; do b=gm/$(basename "$f" .sql)
//	  awk -v up="$b.up.sql" -v down="$b.down.sql" '/^-- \+goose Down/ {d=1} {print > (d ? down : up)}' "$f"
//	done
//	migrate -path gm -database "$DATABASE_URL" up
//
// A development database migrated before the baseline holds goose_db_version rows of files that are gone: Up
// and Pending refuse it with ErrOldSequence, and it is recreated (README, "Recreating the development database").
//
// The library's statements are prepared once per connection: PostgreSQL keeps a plan made while the tables were
// empty until their statistics change, so a database that runs with autovacuum off (as the benchmark machine
// does) needs an ANALYZE once it has grown, or those plans keep scanning the tables.
package migrations

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
)

// FS holds the migration files, NNNNN_name.sql at its root, for a service that runs them with its own goose.
//
//go:embed *.sql
var FS embed.FS

// Up applies every migration that the database has not seen yet. Returns ErrOldSequence, having changed
// nothing, for a database migrated before the baseline.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := provider(db)
	if err != nil {
		return err
	}
	if err := refuseOldSequence(ctx, db, p); err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Pending reports whether some migration has not been applied; /readyz uses it. Returns ErrOldSequence for a
// database migrated before the baseline.
func Pending(ctx context.Context, db *sql.DB) (bool, error) {
	p, err := provider(db)
	if err != nil {
		return false, err
	}
	if err := refuseOldSequence(ctx, db, p); err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: pending: %w", err)
	}
	return pending, nil
}

// ErrOldSequence is returned for a database that the sequence before 00001_baseline migrated. Its
// goose_db_version records files that are gone under numbers that new files reuse, so goose would take some new
// ones for applied; and nothing was released with it, so only development databases have it.
var ErrOldSequence = errors.New("migrations: this database was migrated before the baseline migration")

// oldSequenceEnd is the version at which the sequence before the baseline ended: goose_db_version records it on
// every database that sequence brought up to date. Lower versions cannot tell: this sequence's own files take
// them, and a database that a newer binary migrated further is not refused by an older one.
const oldSequenceEnd = 20

// refuseOldSequence returns ErrOldSequence when goose_db_version records oldSequenceEnd as applied and p has no
// file of that number (once it has, databases of this sequence record that version too).
func refuseOldSequence(ctx context.Context, db *sql.DB, p *goose.Provider) error {
	for _, s := range p.ListSources() {
		if s.Version == oldSequenceEnd {
			return nil
		}
	}
	store, err := database.NewStore(database.DialectPostgres, goose.DefaultTablename)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	ext, ok := store.(database.StoreExtender)
	if !ok {
		return errors.New("migrations: goose's PostgreSQL store cannot tell whether its table exists")
	}
	exists, err := ext.TableExists(ctx, db)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if !exists {
		return nil
	}
	m, err := store.GetMigration(ctx, db, oldSequenceEnd)
	switch {
	case errors.Is(err, database.ErrVersionNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("migrations: %w", err)
	case !m.IsApplied:
		return nil
	}
	return fmt.Errorf("%w: %s records version %d, which this retrysafe has no file for. Nothing was released "+
		"with those migrations: drop the database and migrate a new one (the development database: "+
		`psql "$(scripts/devdb.sh url)/postgres" -c 'DROP DATABASE retrysafe', then make run)`,
		ErrOldSequence, goose.DefaultTablename, oldSequenceEnd)
}

func provider(db *sql.DB) (*goose.Provider, error) {
	// The session lock lets several processes start at once: one migrates, the others wait for it.
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Digest is a short hash of every migration file: two databases migrated by binaries with the same Digest have
// the same library tables. services/schema's Digest, which names test schemas, includes it.
func Digest() string {
	sum := sha256.New()
	names, _ := fs.Glob(FS, "*.sql")
	for _, name := range names {
		raw, _ := FS.ReadFile(name)
		fmt.Fprintf(sum, "%s %d\n", name, len(raw))
		sum.Write(raw)
	}
	return hex.EncodeToString(sum.Sum(nil))[:8]
}
