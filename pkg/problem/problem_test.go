package problem_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

func TestRender(t *testing.T) {
	t.Parallel()
	wrapped := fmt.Errorf("tickets: get: %w", problem.NotFound("ticket"))
	status, doc := problem.Render(wrapped)
	if status != http.StatusNotFound || doc["code"] != "not_found" || doc["detail"] != "ticket not found" || !errors.Is(wrapped, problem.ErrNotFound) {
		t.Errorf("not found: %d %v", status, doc)
	}

	status, doc = problem.Render(problem.Validation(problem.FieldError{Field: "title", Message: "is required"}).With("hint", "x"))
	if status != http.StatusUnprocessableEntity || doc["code"] != "validation_failed" || doc["hint"] != "x" || len(doc["errors"].([]problem.FieldError)) != 1 {
		t.Errorf("validation: %d %v", status, doc)
	}

	// An extension may not overwrite a standard member.
	_, doc = problem.Render(problem.New(problem.CodeInvalidState, "no").With("status", 200))
	if doc["status"] != http.StatusConflict {
		t.Errorf("status member overwritten: %v", doc)
	}

	// Unknown errors never show their text.
	status, doc = problem.Render(errors.New("pq: password authentication failed for user app"))
	if status != http.StatusInternalServerError || doc["code"] != "internal" || fmt.Sprint(doc["detail"]) == "pq: password authentication failed for user app" {
		t.Errorf("internal: %d %v", status, doc)
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	h := problem.Headers(&problem.Error{Code: problem.CodeRequestInProgress, RetryAfter: 2})
	if h.Get("Content-Type") != "application/problem+json" || h.Get("Cache-Control") != "no-store" || h.Get("Retry-After") != "2" {
		t.Errorf("headers = %v", h)
	}
	if h := problem.Headers(problem.ErrStoreUnavailable); h.Get("Retry-After") == "" {
		t.Errorf("store unavailable without Retry-After: %v", h)
	}
}

func TestStoreErrors(t *testing.T) {
	t.Parallel()
	if !problem.IsStoreUnavailable(&pgconn.PgError{Code: "57P01"}) || !problem.IsStoreUnavailable(&pgconn.PgError{Code: "08006"}) {
		t.Error("connection failures are not store_unavailable")
	}
	if problem.IsStoreUnavailable(&pgconn.PgError{Code: "23505"}) || problem.IsStoreUnavailable(errors.New("x")) {
		t.Error("a refused query is store_unavailable")
	}
	dup := fmt.Errorf("create: %w", &pgconn.PgError{Code: "23505", ConstraintName: "tickets_source_event"})
	if !problem.IsUniqueViolation(dup, "tickets_source_event") || problem.IsUniqueViolation(dup, "other") || !problem.IsUniqueViolation(dup, "") {
		t.Error("unique violation not recognised through wrapping")
	}
}
