package opstatus_test

import (
	"context"
	"errors"
	"testing"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// TestListPagesUnknownFirst walks every page of an account's operations: unknown ones first, then newest first,
// each operation exactly once, other accounts never, filters applied on every page.
func TestListPagesUnknownFirst(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	// 130 operations a second apart (some created at the same instant, to exercise the id tie-break); every
	// tenth unknown, every seventh of another kind; and operations of another account.
	err := db.Exec(`
INSERT INTO operations (id, account_id, kind, state, idempotency_key, created_at)
SELECT format('op_%s', lpad(i::text, 4, '0')), 'acct', CASE WHEN i % 7 = 0 THEN 'other.kind' ELSE 'test.kind' END,
       CASE WHEN i % 10 = 0 THEN 'unknown' ELSE 'succeeded' END, 'k-' || i,
       timestamptz '2026-01-01' + make_interval(secs => i / 2)
FROM generate_series(1, 130) AS i;
INSERT INTO operations (id, account_id, kind, state) SELECT 'op_x' || i, 'acct_other', 'test.kind', 'unknown'
FROM generate_series(1, 20) AS i`).Error
	if err != nil {
		t.Fatal(err)
	}
	walk := func(f opstatus.ListFilter) []opstatus.Operation {
		t.Helper()
		var all []opstatus.Operation
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatal("the pages do not end")
			}
			p, err := opstatus.List(ctx, db.Pool, "acct", f)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, p.Operations...)
			if p.Next == "" {
				return all
			}
			f.After = p.Next
		}
	}
	all := walk(opstatus.ListFilter{Limit: 17})
	if len(all) != 130 {
		t.Fatalf("%d operations over the pages; want 130", len(all))
	}
	seen := map[string]bool{}
	for i, op := range all {
		if seen[op.ID] || op.AccountID != "acct" {
			t.Fatalf("operation %s listed twice or from another account", op.ID)
		}
		seen[op.ID] = true
		if i < 13 && op.State != opstatus.StateUnknown || i >= 13 && op.State == opstatus.StateUnknown {
			t.Fatalf("operation %d is %s: the 13 unknown ones must come first", i, op.State)
		}
		if i > 0 && i != 13 {
			prev := all[i-1]
			if prev.CreatedAt.Before(op.CreatedAt) || prev.CreatedAt.Equal(op.CreatedAt) && prev.ID < op.ID {
				t.Fatalf("%s (%s) listed before %s (%s): not newest first", prev.ID, prev.CreatedAt, op.ID, op.CreatedAt)
			}
		}
	}
	if got := walk(opstatus.ListFilter{Kind: "other.kind", State: opstatus.StateSucceeded, Limit: 5}); len(got) != 17 {
		t.Fatalf("%d succeeded other.kind operations; want 17", len(got))
	}
	for _, bad := range []string{"nope", "e30"} {
		_, err := opstatus.List(ctx, db.Pool, "acct", opstatus.ListFilter{After: bad})
		if !errors.Is(err, &problem.Error{Code: "validation_failed"}) {
			t.Fatalf("cursor %q: %v; want a validation problem", bad, err)
		}
	}
}
