package resolution_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/pkg/resolution"
)

// Resolve refuses, and records nothing, a decision on a kind of a service the process does not run
// (resolver_elsewhere) and one whose call may still land (call_may_still_land with Retry-After); once the
// lease has ended the same decision is recorded.
func TestResolveWaitsForTheCallAndItsService(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	lease := time.Now().Add(time.Minute)
	op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct", Kind: "payments.capture", State: opstatus.StateUnknown,
		IdempotencyKey: "k", Fingerprint: "fp", LeaseExpiresAt: &lease}
	testdb.CreateOperation(t, db.DB, op)
	d := opstatus.Decision{State: opstatus.StateFailed, Evidence: "nothing at the provider"}
	released := 0
	resolvers := map[string]resolution.Resolver{"payments.capture": resolution.ResolverFunc(
		func(context.Context, *gorm.DB, opstatus.Operation, opstatus.Decision) error { released++; return nil })}

	_, err := resolution.Resolve(ctx, db.DB, "acct", op.ID, "approver:x", d, nil, []string{"tickets"})
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != "resolver_elsewhere" || p.Extensions["service"] != "payments" {
		t.Fatalf("decision in a tickets process: %v; want resolver_elsewhere naming payments", err)
	}
	_, err = resolution.Resolve(ctx, db.DB, "acct", op.ID, "approver:x", d, resolvers, []string{"tickets"})
	if !errors.As(err, &p) || p.Code != "call_may_still_land" || p.RetryAfter < 1 || released != 0 {
		t.Fatalf("decision while the lease runs: %v (released %d); want call_may_still_land with Retry-After", err, released)
	}
	if err := db.Exec(`UPDATE operations SET lease_expires_at = now() - interval '1 second' WHERE id = ?`, op.ID).Error; err != nil {
		t.Fatal(err)
	}
	got, err := resolution.Resolve(ctx, db.DB, "acct", op.ID, "approver:x", d, resolvers, nil)
	if err != nil || got.State != opstatus.StateFailed || released != 1 {
		t.Fatalf("decision after the lease: %+v, %v (released %d)", got.State, err, released)
	}
}
