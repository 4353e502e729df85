package payments

import (
	"context"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/provider"
)

// dispatchRecorder writes an operation's provider calls into its history (its audit records).
type dispatchRecorder struct {
	db        *gorm.DB
	accountID string
	opID      string
	actor     string
	s         *Server
}

var _ provider.DispatchObserver = dispatchRecorder{}

// Started refuses, and so the client does not send, when the operation is no longer running: its claim was
// released (its owner looked gone) or it was settled while this process was not looking.
func (r dispatchRecorder) Started(ctx context.Context, d provider.Dispatch) error {
	return opstatus.StartDispatch(ctx, database.SQL(r.db), r.accountID, r.opID, r.actor, d)
}

func (r dispatchRecorder) Finished(ctx context.Context, d provider.Dispatch) {
	// The call's own deadline may be what ended it; the record of how it ended must still be written.
	ctx = context.WithoutCancel(ctx)
	// opstore.EventDispatch* are "dispatch_" and the state.
	if err := opstatus.Append(ctx, database.SQL(r.db), r.accountID, r.opID, "dispatch_"+string(d.State), r.actor, d); err != nil {
		if l := r.s.idem.Logger; l != nil {
			l.WarnContext(ctx, "dispatch outcome not recorded", "operation_id", r.opID,
				"state", string(d.State), "error", err.Error())
		}
	}
}
