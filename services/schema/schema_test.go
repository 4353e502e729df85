package schema_test

import (
	"database/sql"
	"errors"
	"slices"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/migrations"
	"github.com/retrysafe/retrysafe/services/schema"
)

// TestUp migrates an empty schema: it gets the library's tables and the demo services', recorded in their two
// version tables, with nothing pending; a second Up finds nothing to do.
func TestUp(t *testing.T) {
	t.Parallel()
	db := open(t, testdb.EmptySchema(t))
	if pending, err := schema.Pending(t.Context(), db); err != nil || !pending {
		t.Fatalf("Pending before Up: %v, %v", pending, err)
	}
	if err := schema.Up(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	tables := tableNames(t, db)
	for _, name := range append(slices.Clone(schema.Tables), schema.VersionTable, goose.DefaultTablename, "operations") {
		if !slices.Contains(tables, name) {
			t.Errorf("Up did not create %s (it created %v)", name, tables)
		}
	}
	if pending, err := schema.Pending(t.Context(), db); err != nil || pending {
		t.Errorf("Pending after Up: %v, %v", pending, err)
	}
	if err := schema.Up(t.Context(), db); err != nil {
		t.Errorf("Up again: %v", err)
	}
}

// TestRefuseOldSequence: a database that the migrations before the baselines brought up to date (library
// version 20, demo version 5) is refused by Up and Pending, and left as it was: no demo table, no demo record.
func TestRefuseOldSequence(t *testing.T) {
	t.Parallel()
	db := open(t, testdb.EmptySchema(t))
	record(t, db, goose.DefaultTablename, 1, 3, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
	record(t, db, schema.VersionTable, 1, 2, 3, 4, 5)
	if err := schema.Up(t.Context(), db); !errors.Is(err, migrations.ErrOldSequence) {
		t.Errorf("Up: %v, want ErrOldSequence", err)
	}
	if _, err := schema.Pending(t.Context(), db); !errors.Is(err, migrations.ErrOldSequence) {
		t.Errorf("Pending: %v, want ErrOldSequence", err)
	}
	if tables := tableNames(t, db); len(tables) != 2 {
		t.Errorf("tables after the refusals: %v, want only the two version tables", tables)
	}
	var demo int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM `+schema.VersionTable).Scan(&demo); err != nil || demo != 6 {
		t.Errorf("demo versions after the refusals: %d, %v; want the 6 rows recorded", demo, err)
	}
}

// record creates goose's version table named table, as goose does (version 0 first), and records versions as
// applied.
func record(t *testing.T, db *sql.DB, table string, versions ...int64) {
	t.Helper()
	store, err := database.NewStore(database.DialectPostgres, table)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateVersionTable(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	for _, v := range append([]int64{0}, versions...) {
		if err := store.Insert(t.Context(), db, database.InsertRequest{Version: v}); err != nil {
			t.Fatal(err)
		}
	}
}

func tableNames(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT tablename FROM pg_tables WHERE schemaname = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	return names
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	return db
}
