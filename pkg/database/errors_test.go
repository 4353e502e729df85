package database_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/pkg/database"
)

func TestUniqueViolation(t *testing.T) {
	t.Parallel()
	dup := fmt.Errorf("create: %w", &pgconn.PgError{Code: "23505", ConstraintName: "tickets_source_event"})
	if !database.UniqueViolation(dup, "tickets_source_event") || database.UniqueViolation(dup, "other") || !database.UniqueViolation(dup, "") {
		t.Error("unique violation not recognised through wrapping")
	}
	if database.UniqueViolation(errors.New("23505"), "") || database.UniqueViolation(&pgconn.PgError{Code: "23503"}, "") {
		t.Error("another error taken for a unique violation")
	}
}
