package migrations_test

import (
	"database/sql"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/retrysafe/retrysafe/internal/testdb"
)

// emptySchema opens a schema of its own with nothing in it, on at most conns connections (goose's advisory
// lock and a migration's statements stay on one when conns is 1).
func emptySchema(t *testing.T, conns int) (*gorm.DB, *sql.DB) {
	t.Helper()
	db, err := gorm.Open(postgres.Open(testdb.EmptySchema(t)), &gorm.Config{Logger: gormlogger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(conns)
	t.Cleanup(func() { sqlDB.Close() })
	return db, sqlDB
}
