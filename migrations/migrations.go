// Package migrations embeds the library's tables (idempotency keys, operations and their events, approvals, the
// audit chain heads and checkpoints, console sessions) and applies them with goose. The demo services' tables
// are not here: services/schema applies them after these.
//
// Every file is plain SQL with goose annotations, numbered in the order it applies (numbers may skip: they
// stay those of the single sequence that once held the demo tables too), recorded in goose's default table,
// goose_db_version. A service that uses the library migrates its database in one of three ways:
//
//   - from Go, at start: migrations.Up(ctx, sqlDB), which takes a PostgreSQL advisory lock, so replicas that
//     start at once migrate one at a time;
//   - with its own goose: the files are FS, for goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS),
//     or on the command line from a checkout, `goose -dir migrations postgres "$DATABASE_URL" up`. Keep them in
//     goose_db_version, or give them a table of their own (-table, goose.WithTableName) if the service's own
//     goose migrations use that one;
//   - with golang-migrate: not as they are. It wants NAME.up.sql and NAME.down.sql pairs, runs a file as one
//     statement list without goose's StatementBegin/End blocks, and keeps one version, not the set of applied
//     ones. Splitting each file at "-- +goose Down" into the pair does apply, into a database of its own
//     schema_migrations table, but a database one tool has migrated cannot be handed to the other.
package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the migration files, NNNNN_name.sql at its root, for a service that runs them with its own goose.
//
//go:embed *.sql
var FS embed.FS

// Up applies every migration that the database has not seen yet.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := provider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Pending reports whether some migration has not been applied; /readyz uses it.
func Pending(ctx context.Context, db *sql.DB) (bool, error) {
	p, err := provider(db)
	if err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: pending: %w", err)
	}
	return pending, nil
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
// the same schema. Test schemas are named with it, so a schema is reused only by code that expects its tables.
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
