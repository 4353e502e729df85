package payments

// Corrections: a capture the provider executed more than once (an operation settled duplicate_effect_confirmed)
// is corrected by refunds that name it in Remediates-Operation-Id, until they have returned what the duplicate
// took and never beyond. The link is two events, one on each operation, written in each refund's claim
// transaction, so a correction and its link commit together or not at all.
//
// A refund the provider executed more than once is booked as executed (every execution in refunded_minor,
// settle.go) and is never corrected by a refund: another refund would pay the customer a third time. Its money
// comes back outside retrysafe (the provider reverses the extra execution, or the customer returns it), as a
// person decides; a refund naming it is 409 duplicate_refund_not_refundable (docs/payments.md).
//
// A duplicated capture took its amount more than once, beyond what the intent authorized, and left the intent
// reserved (capturing). Its correction first records the capture as the provider executed it, from the
// reconciler's evidence: captured_minor one execution, duplicate_captured_minor the others. The correction then
// refunds from duplicate_captured_minor, not from the capture, so refunds never exceed what was really captured
// and the customer's own refunds keep the whole capture (services/schema/00001_baseline.sql).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// HeaderRemediates names, on a refund, the duplicate_effect_confirmed capture it corrects (a duplicated refund
// is refused: duplicate_refund_not_refundable).
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
	return problem.New("invalid_request", "the %s header %s", HeaderRemediates, detail).With("header", HeaderRemediates)
}

// remediatedIntent reads the intent the corrected operation acted on. Each read below is a statement of its own
// after the corrected operation's lock (see ReserveRefund on READ COMMITTED).
const remediatedIntent = `
SELECT intent_id FROM payment_refunds WHERE account_id = ? AND operation_id = ?
UNION ALL
SELECT id FROM payment_intents WHERE account_id = ? AND pending_operation_id = ?
UNION ALL
SELECT id FROM payment_intents WHERE account_id = ? AND duplicate_capture_operation_id = ?
LIMIT 1`

// duplicateEvidence is what a correction reads of the evidence the duplicate was settled on, the reconciler's
// last provider lookup that found the call: how many times it executed and the amount of one execution.
type duplicateEvidence struct {
	Effects []json.RawMessage `json:"effects"`
	Body    struct {
		AmountMinor json.Number `json:"amount_minor"`
	} `json:"body"`
}

// duplicateAmounts reads the evidence duplicate operation dupID was settled on: the amount of one execution and
// how many executions the provider made (0 when the evidence is missing or unreadable).
func duplicateAmounts(ctx context.Context, db *gorm.DB, accountID, dupID string) (each, effects int64, err error) {
	raw, err := opstore.LastEventDetail(ctx, database.SQL(db), accountID, dupID, EventProviderLookup, "effects")
	if err != nil {
		return 0, 0, fmt.Errorf("payments: remediate %s: evidence: %w", dupID, err)
	}
	var dup duplicateEvidence
	if raw == nil {
		return 0, 0, nil
	}
	if json.Unmarshal(raw, &dup) != nil || dup.Body.AmountMinor == "" {
		return 0, 0, nil
	}
	if each, err = dup.Body.AmountMinor.Int64(); err != nil {
		return 0, 0, nil
	}
	return each, int64(len(dup.Effects)), nil
}

// remediate checks, in the claim transaction of refund operation op on intentID, that dupID names a
// duplicate_effect_confirmed capture of the same intent, that the refund of amountMinor does not return more than
// the duplicate took (the executions after the first) less its corrections so far that did not fail, and links
// the two. It records the capture on the intent (DuplicateCaptured, unless an earlier correction did), and the
// refund then returns the duplicate's money (ReserveDuplicateRefund). Once the corrections have returned all the
// duplicate took, another is a 409 already_remediated naming the first; a replay of a correction's key never gets
// here (idem answers it from the stored response). A duplicated refund is 409 duplicate_refund_not_refundable.
func (s *Server) remediate(ctx context.Context, tx *gorm.DB, accountID, intentID, dupID string, amountMinor int64, op opstatus.Operation, actor string) error {
	db := tx.WithContext(ctx)
	state, err := lockDuplicate(ctx, db, accountID, dupID)
	if err != nil {
		return err
	}
	if err := checkSameIntent(db, accountID, intentID, dupID); err != nil {
		return err
	}
	each, effects, err := duplicateAmounts(ctx, db, accountID, dupID)
	if err != nil {
		return err
	}
	if effects < 2 {
		// Fail closed: without the evidence the duplicate amount is not known, and a person settles it.
		return problem.New("invalid_state", "operation %s has no provider record of its duplicate to correct against", dupID).
			With("operation_id", dupID).With("state", state)
	}
	extra := each * (effects - 1)
	if err := checkUnreturned(ctx, db, accountID, intentID, dupID, amountMinor, each, effects); err != nil {
		return err
	}
	if _, err := s.cfg.Store.DuplicateCaptured(ctx, tx, accountID, dupID, each, extra); err != nil && !errors.Is(err, ErrNotReserved) {
		return err // ErrNotReserved: an earlier correction recorded it
	}
	return linkCorrection(ctx, tx, accountID, dupID, op.ID, actor)
}

// lockDuplicate locks the corrected operation dupID, so two corrections of it sent at once are decided one after
// the other, and returns its state once it is a duplicate_effect_confirmed capture; otherwise the problem that
// refuses the correction.
func lockDuplicate(ctx context.Context, db *gorm.DB, accountID, dupID string) (opstatus.State, error) {
	kind, lockedState, found, err := opstore.LockKindState(ctx, database.SQL(db), accountID, dupID)
	if err != nil {
		return "", fmt.Errorf("payments: remediate %s: %w", dupID, err)
	}
	state := opstatus.State(lockedState)
	switch {
	case !found:
		return "", headerProblem("names no operation of this account")
	case kind != KindCapture && kind != KindRefund:
		return "", headerProblem("names a " + kind + " operation; only a capture can be corrected")
	case state != opstatus.StateDuplicateEffect:
		return "", problem.New("invalid_state", "operation %s is %s; only a duplicate_effect_confirmed operation is corrected with %s",
			dupID, state, HeaderRemediates).With("operation_id", dupID).With("state", state)
	case kind == KindRefund:
		return "", problem.New("duplicate_refund_not_refundable",
			"operation %s is a refund the provider executed more than once, booked as such; another refund would pay the customer again: "+
				"its money comes back through the provider or the customer (docs/payments.md), nothing was sent", dupID).
			With("operation_id", dupID)
	}
	return state, nil
}

// checkSameIntent refuses a correction of dupID unless the duplicate acted on intentID, the intent refunded.
func checkSameIntent(db *gorm.DB, accountID, intentID, dupID string) error {
	var intent []string
	if err := db.Raw(remediatedIntent, accountID, dupID, accountID, dupID, accountID, dupID).Scan(&intent).Error; err != nil {
		return fmt.Errorf("payments: remediate %s: intent: %w", dupID, err)
	}
	if len(intent) == 0 || intent[0] != intentID {
		return headerProblem("names an operation of another payment intent; a correction refunds the intent the duplicate charged")
	}
	return nil
}

// checkUnreturned refuses a correction of amountMinor beyond what the duplicate took (effects-1 executions of
// each) less what earlier corrections return, pending or done: 409 already_remediated once nothing is left, 422
// amount_too_large when the refund asks more than is left. The sum is read after the duplicate's lock, which
// every correction of it takes, so two corrections sent at once are counted one after the other.
func checkUnreturned(ctx context.Context, db *gorm.DB, accountID, intentID, dupID string, amountMinor, each, effects int64) error {
	extra := each * (effects - 1)
	var returned int64
	if err := db.Raw(heldSQL, accountID, intentID, true).Scan(&returned).Error; err != nil {
		return fmt.Errorf("payments: remediate %s: returned so far: %w", dupID, err)
	}
	if returned >= extra {
		return alreadyRemediated(ctx, db, accountID, dupID, extra)
	}
	if available := extra - returned; amountMinor > available {
		return problem.New("amount_too_large",
			"a correction refunds at most what the duplicate took and earlier corrections have not returned: %d minor units (%d executions of %d, %d returned)",
			available, effects, each, returned).With("available_minor", available)
	}
	return nil
}

// alreadyRemediated is the 409 for a duplicate whose corrections return all it took (extra), naming the first
// correction that did not fail (the provider refused a failed one, or it never reached it).
func alreadyRemediated(ctx context.Context, db *gorm.DB, accountID, dupID string, extra int64) error {
	by, err := opstore.LinkedNotFailed(ctx, database.SQL(db), accountID, dupID, EventRemediatedBy, "remediated_by")
	if err != nil {
		return fmt.Errorf("payments: remediate %s: earlier correction: %w", dupID, err)
	}
	p := problem.New("already_remediated",
		"operation %s is already corrected: its corrections return all the duplicate took (%d minor units); another would refund it twice", dupID, extra).
		With("operation_id", dupID)
	if by != "" {
		p = p.With("remediated_by", by)
	}
	return p
}

// linkCorrection writes the two events that link correction opID and the duplicate dupID it corrects.
func linkCorrection(ctx context.Context, tx *gorm.DB, accountID, dupID, opID, actor string) error {
	if err := opstatus.Append(ctx, database.SQL(tx), accountID, dupID, EventRemediatedBy, actor,
		opstore.Link{RemediatedBy: opID}); err != nil {
		return err
	}
	return opstatus.Append(ctx, database.SQL(tx), accountID, opID, EventRemediates, actor,
		opstore.Link{Remediates: dupID})
}
