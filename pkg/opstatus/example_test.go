package opstatus_test

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// A background worker starts a queued job: the job's row and its operation change in one commit, so a caller
// asking GET /v1/operations/{id} never sees one without the other.
func ExampleTransition() {
	var db *gorm.DB // the service's database
	ctx := context.Background()
	jobID, accountID, opID := "job_1", "acct_1", "op_1"
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`UPDATE jobs SET state = 'running' WHERE id = ? AND state = 'queued'`, jobID).Error; err != nil {
			return err
		}
		// From makes the move conditional: a job already picked up by another worker is left alone.
		_, err := opstatus.Transition(ctx, database.SQL(tx), accountID, opID, opstatus.StateRunning, "system:jobs.worker",
			opstatus.From(opstatus.StateQueued), opstatus.WithEvent("started", map[string]any{"worker": 1}))
		return err
	})
	_ = err
}

// The recovery worker marks operations whose lease ran out as unknown and asks the reconciler of their kind,
// which settles them from the other side's records, never by doing the effect again.
func ExampleRecoveryWorker() {
	var db *gorm.DB
	lookup := opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
		// Ask the other side what it did under the operation's downstream key, then record it (idem.Handler.Settle).
		// Returning an error leaves the operation unknown for a later pass.
		return nil
	})
	w := &opstatus.RecoveryWorker{DB: database.SQL(db), Reconcilers: map[string]opstatus.Reconciler{"jobs.run": lookup}, Interval: 5 * time.Second}
	go w.Run(context.Background())
}
