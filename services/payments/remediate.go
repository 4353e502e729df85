package payments

// Corrections: a duplicate the provider executed (an operation settled duplicate_effect_confirmed) is corrected
// by a refund that names it in Remediates-Operation-Id. The link is two events, one on each operation, written in
// the refund's claim transaction, so the correction and the link commit together or not at all.
//
// A duplicated capture took its amount more than once, beyond what the intent authorized, and left the intent
// reserved (capturing). Its correction first records the capture as the provider executed it, from the
// reconciler's evidence: captured_minor one execution, duplicate_captured_minor the others. The correction then
// refunds from duplicate_captured_minor, not from the capture, so refunds never exceed what was really captured
// and the customer's own refunds keep the whole capture (services/schema/00004_payments_duplicate_capture.sql).

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// HeaderRemediates names, on a refund, the duplicate_effect_confirmed capture or refund it corrects.
const HeaderRemediates = idem.HeaderRemediates

// Events of a correction: the corrected operation gets EventRemediatedBy (detail remediated_by), the
// correction EventRemediates (detail remediates_operation_id). opstatus.GetTimeline shows both links.
const (
	EventRemediatedBy = "remediated_by"
	EventRemediates   = "remediates"
)

// remediatesHeader reads Remediates-Operation-Id: empty when absent, 400 invalid_request when repeated or not an
// operation id.
func remediatesHeader(h http.Header) (string, error) {
	vs := h.Values(HeaderRemediates)
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", headerProblem("must be sent once")
	}
	v := vs[0]
	ok := len(v) > 3 && len(v) <= 128 && v[:3] == "op_"
	for i := 0; ok && i < len(v); i++ {
		ok = v[i] > 0x20 && v[i] <= 0x7e
	}
	if !ok {
		return "", headerProblem("must be an operation id (op_...)")
	}
	return v, nil
}

func headerProblem(detail string) *problem.Error {
	return problem.New(problem.CodeInvalidRequest, "the %s header %s", HeaderRemediates, detail).With("header", HeaderRemediates)
}

// remediatedSQL locks the corrected operation, so two corrections of it sent at once are decided one after the
// other, and reads what the check needs: its kind and state, the intent it acted on, and its correction if it
// has one. Each read below is a statement of its own after the lock (see ReserveRefund on READ COMMITTED).
const (
	lockOperationSQL = `SELECT kind, state FROM operations WHERE account_id = ? AND id = ? FOR UPDATE`
	remediatedIntent = `
SELECT intent_id FROM payment_refunds WHERE account_id = ? AND operation_id = ?
UNION ALL
SELECT id FROM payment_intents WHERE account_id = ? AND pending_operation_id = ?
UNION ALL
SELECT id FROM payment_intents WHERE account_id = ? AND duplicate_capture_operation_id = ?
LIMIT 1`
	// duplicateSQL reads the evidence the duplicate was settled on, the reconciler's last provider lookup that
	// found the call: how many times it executed and the amount of one execution (the provider's answer).
	duplicateSQL = `
SELECT jsonb_array_length(detail->'effects') AS effects, (detail->'body'->>'amount_minor')::bigint AS amount_minor
FROM operation_events
WHERE account_id = ? AND operation_id = ? AND type = 'provider_lookup' AND jsonb_typeof(detail->'effects') = 'array'
ORDER BY id DESC LIMIT 1`
	// remediatedBySQL reads the correction of an operation, unless it failed (the provider refused it, or it
	// never reached the provider): that one returned nothing, and another may.
	remediatedBySQL = `
SELECT e.detail->>'remediated_by' FROM operation_events e
JOIN operations o ON o.account_id = e.account_id AND o.id = e.detail->>'remediated_by'
WHERE e.account_id = ? AND e.operation_id = ? AND e.type = 'remediated_by' AND o.state <> 'failed'
ORDER BY e.id LIMIT 1`
)

// remediate checks, in the claim transaction of refund operation op on intentID, that dupID names a
// duplicate_effect_confirmed capture or refund of the same intent with no correction yet (one that failed does
// not count), that the refund of amountMinor does not return more than the duplicate took (the executions after
// the first), and links the two. For a duplicated capture it records the capture on the intent (DuplicateCaptured,
// unless an earlier, failed correction did) and reports that the refund returns the duplicate's money
// (ReserveDuplicateRefund). A second correction is a 409 already_remediated naming the first; a replay of the
// first correction's key never gets here (idem answers it from the stored response).
func (s *Server) remediate(ctx context.Context, tx *gorm.DB, accountID, intentID, dupID string, amountMinor int64, op opstatus.Operation, actor string) (duplicateCapture bool, err error) {
	db := tx.WithContext(ctx)
	var locked []struct {
		Kind  string
		State opstatus.State
	}
	if err := db.Raw(lockOperationSQL, accountID, dupID).Scan(&locked).Error; err != nil {
		return false, fmt.Errorf("payments: remediate %s: lock: %w", dupID, err)
	}
	switch {
	case len(locked) == 0:
		return false, headerProblem("names no operation of this account")
	case locked[0].Kind != KindCapture && locked[0].Kind != KindRefund:
		return false, headerProblem("names a " + locked[0].Kind + " operation; only a capture or a refund can be corrected")
	case locked[0].State != opstatus.StateDuplicateEffect:
		return false, problem.New(problem.CodeInvalidState, "operation %s is %s; only a duplicate_effect_confirmed operation is corrected with %s",
			dupID, locked[0].State, HeaderRemediates).With("operation_id", dupID).With("state", locked[0].State)
	}
	var intent []string
	if err := db.Raw(remediatedIntent, accountID, dupID, accountID, dupID, accountID, dupID).Scan(&intent).Error; err != nil {
		return false, fmt.Errorf("payments: remediate %s: intent: %w", dupID, err)
	}
	if len(intent) == 0 || intent[0] != intentID {
		return false, headerProblem("names an operation of another payment intent; a correction refunds the intent the duplicate charged")
	}
	var by []string
	if err := db.Raw(remediatedBySQL, accountID, dupID).Scan(&by).Error; err != nil {
		return false, fmt.Errorf("payments: remediate %s: earlier correction: %w", dupID, err)
	}
	if len(by) > 0 {
		return false, problem.New(problem.CodeAlreadyRemediated,
			"operation %s is already corrected by operation %s; a second correction would refund the duplicate twice", dupID, by[0]).
			With("operation_id", dupID).With("remediated_by", by[0])
	}
	var dup []struct {
		Effects     int64
		AmountMinor *int64
	}
	if err := db.Raw(duplicateSQL, accountID, dupID).Scan(&dup).Error; err != nil {
		return false, fmt.Errorf("payments: remediate %s: evidence: %w", dupID, err)
	}
	if len(dup) == 0 || dup[0].AmountMinor == nil || dup[0].Effects < 2 {
		// Fail closed: without the evidence the duplicate amount is not known, and a person settles it.
		return false, problem.New(problem.CodeInvalidState, "operation %s has no provider record of its duplicate to correct against", dupID).
			With("operation_id", dupID).With("state", locked[0].State)
	}
	each := *dup[0].AmountMinor
	extra := each * (dup[0].Effects - 1)
	if amountMinor > extra {
		return false, problem.New(problem.CodeAmountTooLarge, "a correction refunds at most what the duplicate took: %d minor units (%d executions of %d)",
			extra, dup[0].Effects, each).With("available_minor", extra)
	}
	duplicateCapture = locked[0].Kind == KindCapture
	if duplicateCapture {
		_, err := s.cfg.Store.DuplicateCaptured(ctx, tx, accountID, dupID, each, extra)
		if err != nil && !errors.Is(err, ErrNotReserved) { // ErrNotReserved: an earlier, failed correction recorded it
			return false, err
		}
	}
	if err := opstatus.Append(ctx, tx, accountID, dupID, EventRemediatedBy, actor,
		map[string]any{"remediated_by": op.ID}); err != nil {
		return false, err
	}
	return duplicateCapture, opstatus.Append(ctx, tx, accountID, op.ID, EventRemediates, actor,
		map[string]any{"remediates_operation_id": dupID})
}
