// Package migrations embeds the SQL schema of retrysafe and applies it with goose.
//
// Every file is plain SQL with goose annotations, numbered in the order it applies. The binary carries them, so
// `retrysafe migrate` (and `retrysafe serve`, unless MIGRATE_ON_START=false) brings any database up to date.
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

//go:embed *.sql
var files embed.FS

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
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Digest is a short hash of every migration file: two databases migrated by binaries with the same Digest have
// the same schema. Test schemas are named with it, so a schema is reused only by code that expects its tables.
func Digest() string {
	sum := sha256.New()
	names, _ := fs.Glob(files, "*.sql")
	for _, name := range names {
		raw, _ := files.ReadFile(name)
		fmt.Fprintf(sum, "%s %d\n", name, len(raw))
		sum.Write(raw)
	}
	return hex.EncodeToString(sum.Sum(nil))[:8]
}
