// Package schema migrates the database of this repository's demo services: the library's tables (package
// migrations), then the tables of tickets, payments and deploys, a goose sequence of its own recorded in
// retrysafe_demo_version. `retrysafe migrate`, `retrysafe serve` (MIGRATE_ON_START) and internal/testdb use
// it; a service that only uses the library runs migrations.Up and its own migrations.
package schema

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

	"github.com/retrysafe/retrysafe/migrations"
)

//go:embed *.sql
var files embed.FS

// VersionTable records the applied demo migrations, as goose_db_version does the library's.
const VersionTable = "retrysafe_demo_version"

// Tables are the demo services' tables, the ones this sequence creates.
var Tables = []string{
	"tickets", "ticket_comments", "ticket_status_changes",
	"payment_intents", "payment_refunds", "payment_provider_sweep", "payment_restored_effects",
	"environments", "deploys", "environment_locks", "deploy_accounts", "deploy_target_activations", "deploy_target_fences",
}

// Up applies the library's migrations and then the demo services' that the database has not seen yet. Returns
// migrations.ErrOldSequence, having changed nothing, for a database migrated before the baselines.
func Up(ctx context.Context, db *sql.DB) error {
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
// uses it.
func Pending(ctx context.Context, db *sql.DB) (bool, error) {
	if pending, err := migrations.Pending(ctx, db); err != nil || pending {
		return pending, err
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
