package opstatus

import (
	"context"
	"time"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// ExtendLease moves the lease of a queued or running operation id of account to until: a worker that is still alive calls it
// (a heartbeat) so that the recovery worker does not call the outcome unknown. It returns false, and changes
// nothing, when the operation is in no such state: settled, or already unknown because the lease had run out,
// in which case the worker must stop and leave the operation to its reconciler.
func ExtendLease(ctx context.Context, tx database.DBTX, accountID, id string, until time.Time) (bool, error) {
	return opstore.ExtendLease(ctx, tx, accountID, id, until)
}
