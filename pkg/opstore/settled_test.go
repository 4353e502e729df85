package opstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// TestCompletionOfASettledOperationCommitsNothing: a completion sent with COMMIT on an operation no longer running
// under its key fails with ErrAlreadySettled, and nothing of its transaction commits: not the write sent before
// it, not the completion's event. The key keeps the response it had.
func TestCompletionOfASettledOperationCommitsNothing(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	op := create(t, db, opstatus.StateRunning, nil)
	complete := func(status int, note string) error {
		tx, err := database.Begin(ctx, db.DB)
		if err != nil {
			return err
		}
		defer tx.Close()
		if err := opstore.Append(ctx, tx.SQL(), op.AccountID, op.ID, opstore.NewEvent{Type: "observed", Actor: "test",
			Detail: map[string]any{"note": note}}); err != nil {
			return err
		}
		b := &pgx.Batch{}
		c := opstore.Completion{State: string(opstatus.StateSucceeded), Status: status, Body: []byte(`{}`),
			Event: opstore.NewEvent{Type: opstore.EventCompleted, Actor: "test"}, Retention: time.Hour, Lifetime: time.Hour}
		if err := opstore.QueueComplete(b, op.AccountID, op.ID, c); err != nil {
			return err
		}
		return tx.Commit(ctx, b)
	}
	if err := complete(201, "first"); err != nil {
		t.Fatal(err)
	}
	if err := complete(500, "second"); !errors.Is(err, opstore.ErrAlreadySettled) {
		t.Fatalf("a second completion: %v; want ErrAlreadySettled", err)
	}
	evs, _, err := opstore.Events(ctx, db.Pool, op.AccountID, op.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 { // claimed, first's observed, completed
		t.Fatalf("%d events after a refused completion; want 3: %+v", len(evs), evs)
	}
	var status int
	db.Raw(`SELECT response_status FROM operations WHERE id = ?`, op.ID).Scan(&status)
	if status != 201 {
		t.Fatalf("stored response %d; want the first completion's 201", status)
	}
}
