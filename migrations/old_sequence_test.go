package migrations_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/retrysafe/retrysafe/migrations"
)

// TestRefuseOldSequence: a database whose goose_db_version holds the records of the migrations before the
// baseline, up to date (version 20), is refused by Up and Pending with what to do, and nothing is created in it;
// goose alone would find the baseline, version 1, applied and run nothing.
func TestRefuseOldSequence(t *testing.T) {
	t.Parallel()
	db, sqlDB := emptySchema(t, 2)
	store, err := database.NewStore(database.DialectPostgres, goose.DefaultTablename)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateVersionTable(t.Context(), sqlDB); err != nil {
		t.Fatal(err)
	}
	for _, v := range []int64{0, 1, 3, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20} {
		if err := store.Insert(t.Context(), sqlDB, database.InsertRequest{Version: v}); err != nil {
			t.Fatal(err)
		}
	}

	err = migrations.Up(t.Context(), sqlDB)
	if !errors.Is(err, migrations.ErrOldSequence) {
		t.Fatalf("Up: %v, want ErrOldSequence", err)
	}
	for _, want := range []string{"goose_db_version records version 20", "DROP DATABASE retrysafe", "make run"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if _, err := migrations.Pending(t.Context(), sqlDB); !errors.Is(err, migrations.ErrOldSequence) {
		t.Errorf("Pending: %v, want ErrOldSequence", err)
	}
	var tables []string
	if err := db.Raw(`SELECT tablename FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables).Error; err != nil {
		t.Fatal(err)
	}
	if strings.Join(tables, " ") != goose.DefaultTablename {
		t.Errorf("tables after the refusals: %v, want only %s", tables, goose.DefaultTablename)
	}

}
