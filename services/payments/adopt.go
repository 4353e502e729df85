package payments

// Adoption: a request whose rows a failover lost and the sweep restored (heal.go) may still be sent again under
// its Idempotency-Key. Its provider key is the one the lost call went out under, so it finds the restored effect
// (payment_restored_effects) and adopts it: no reservation, no provider call, and the answer the lost request
// would have had, from the restored row as it stands now. Without it a create would find its order taken, a
// capture its intent already succeeded, and a refund would be booked a second time.

import (
	"context"
	"net/http"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// EventAdoptsRestored is the event of an operation that adopted a restored effect (detail restore_operation_id
// is not kept: the row links them).
const EventAdoptsRestored = "adopts_restored"

// adoptRestored runs first in each Prepare, on the claim's transaction: it reports whether op adopts an effect
// the sweep restored.
func (s *Server) adoptRestored(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (bool, error) {
	key, err := downstreamKeyIn(ctx, tx, op)
	if err != nil {
		return false, err
	}
	r, found, err := adoptRestoredEffect(ctx, tx, op.AccountID, key, op.ID)
	if err != nil || !found {
		return false, err
	}
	return true, opstatus.Append(ctx, database.SQL(tx), op.AccountID, op.ID, EventAdoptsRestored, "system:payments",
		map[string]string{"resource_type": r.ResourceType, "resource_id": r.ResourceID, "provider_key": key})
}

// recordAdopted runs first in each Record: for an operation that adopted a restored effect it answers as the
// lost request would have, from the row as it stands now; handled false otherwise.
func (s *Server) recordAdopted(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (res idem.Result, handled bool, err error) {
	r, found, err := adoptedResource(ctx, tx, op.AccountID, op.ID)
	if err != nil || !found {
		return idem.Result{}, false, err
	}
	if r.ResourceType == "refund" {
		rf, err := s.cfg.Store.Refund(ctx, tx, op.AccountID, r.ResourceID)
		if err != nil {
			return idem.Result{}, true, err
		}
		return withResource(idem.Result{Status: http.StatusCreated, Body: rf,
			Header: http.Header{"Location": {"/v1/refunds/" + rf.ID}}}, "refund", rf.ID), true, nil
	}
	in, err := s.cfg.Store.Intent(ctx, tx, op.AccountID, r.ResourceID)
	if err != nil {
		return idem.Result{}, true, err
	}
	if op.Kind == KindCreateIntent {
		return withResource(idem.Result{Status: http.StatusCreated, Body: in,
			Header: http.Header{"Location": {"/v1/payment_intents/" + in.ID}}}, "payment_intent", in.ID), true, nil
	}
	return withResource(idem.Result{Status: http.StatusOK, Body: in}, "payment_intent", in.ID), true, nil
}
