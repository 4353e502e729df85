package payments

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// PostgresStore is the Store on gorm + PostgreSQL (services/schema/00001_baseline.sql).
type PostgresStore struct{}

var _ Store = PostgresStore{}

const intentColumns = `id, account_id, order_id, currency, amount_minor, description, status, captured_minor,
refunded_minor, provider_authorization_id, duplicate_capture_operation_id, duplicate_captured_minor,
duplicate_refunded_minor, created_at, updated_at`

const refundColumns = `id, account_id, intent_id, currency, amount_minor, reason, status, provider_refund_id,
returns_duplicate_capture, executions, created_at, updated_at`

// BeginIntent implements Store. The partial unique index payment_intents_active_order decides between
// concurrent creates: ON CONFLICT DO NOTHING waits for the other transaction, and the statement after it reads
// the winner, so the transaction is never aborted by a unique violation.
func (PostgresStore) BeginIntent(ctx context.Context, tx *gorm.DB, accountID, opID string, cmd CreateIntent) (Intent, error) {
	var rows []Intent
	err := tx.WithContext(ctx).Raw(`
INSERT INTO payment_intents (id, account_id, order_id, currency, amount_minor, description, status, create_operation_id)
VALUES (?, ?, ?, ?, ?, ?, 'authorizing', ?)
ON CONFLICT (account_id, order_id) WHERE status NOT IN ('failed', 'canceled') DO NOTHING
RETURNING `+intentColumns,
		ids.New("pi_"), accountID, cmd.OrderID, cmd.Currency, cmd.AmountMinor, cmd.Description, opID).Scan(&rows).Error
	if err != nil {
		return Intent{}, fmt.Errorf("payments: begin intent: %w", err)
	}
	if len(rows) == 1 {
		return rows[0], nil
	}
	var existing []Intent
	err = tx.WithContext(ctx).Raw(`SELECT `+intentColumns+` FROM payment_intents
WHERE account_id = ? AND order_id = ? AND status NOT IN ('failed', 'canceled')`, accountID, cmd.OrderID).Scan(&existing).Error
	if err != nil {
		return Intent{}, fmt.Errorf("payments: begin intent: existing: %w", err)
	}
	if len(existing) == 0 {
		// The winner failed or was canceled between the two statements; the caller may simply retry.
		return Intent{}, problem.New("order_has_active_intent", "order %q had an active payment intent a moment ago; retry", cmd.OrderID)
	}
	return Intent{}, problem.New("order_has_active_intent",
		"order %q already has an active payment intent; capture or cancel it instead of creating another", cmd.OrderID).
		With("existing_intent_id", existing[0].ID)
}

// moveIntent applies set to the intent matched by where (args fill both, in order) and returns it. A where
// that matches nothing (the intent is not in the state the move starts from) is ErrNotReserved.
func moveIntent(ctx context.Context, tx *gorm.DB, what, set, where string, args ...any) (Intent, error) {
	var rows []Intent
	err := tx.WithContext(ctx).Raw(`UPDATE payment_intents SET `+set+`, updated_at = now() WHERE `+where+
		` RETURNING `+intentColumns, args...).Scan(&rows).Error
	if err != nil {
		return Intent{}, fmt.Errorf("payments: %s: %w", what, err)
	}
	if len(rows) == 0 {
		return Intent{}, fmt.Errorf("payments: %s: %w", what, ErrNotReserved)
	}
	return rows[0], nil
}

// Authorized implements Store.
func (PostgresStore) Authorized(ctx context.Context, tx *gorm.DB, accountID, opID, authorizationID string) (Intent, error) {
	return moveIntent(ctx, tx, "authorized", `status = 'requires_capture', provider_authorization_id = ?`,
		`account_id = ? AND create_operation_id = ? AND status = 'authorizing'`, authorizationID, accountID, opID)
}

// AuthorizationFailed implements Store.
func (PostgresStore) AuthorizationFailed(ctx context.Context, tx *gorm.DB, accountID, opID string) (Intent, error) {
	return moveIntent(ctx, tx, "authorization failed", `status = 'failed'`,
		`account_id = ? AND create_operation_id = ? AND status = 'authorizing'`, accountID, opID)
}

// BeginCapture implements Store.
func (s PostgresStore) BeginCapture(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string) (Intent, error) {
	return s.reserve(ctx, tx, accountID, intentID, opID, StatusCapturing, "captured")
}

// BeginCancel implements Store.
func (s PostgresStore) BeginCancel(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string) (Intent, error) {
	return s.reserve(ctx, tx, accountID, intentID, opID, StatusCanceling, "canceled")
}

// reserve moves an intent from requires_capture to status for opID in one conditional statement: a concurrent
// reservation waits on the row and then finds it no longer in requires_capture.
func (s PostgresStore) reserve(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string, status IntentStatus, verb string) (Intent, error) {
	in, err := moveIntent(ctx, tx, "reserve "+string(status), `status = ?, pending_operation_id = ?`,
		`account_id = ? AND id = ? AND status = 'requires_capture'`, status, opID, accountID, intentID)
	if !errors.Is(err, ErrNotReserved) {
		return in, err
	}
	current, gerr := s.Intent(ctx, tx, accountID, intentID)
	if gerr != nil {
		return Intent{}, gerr
	}
	return Intent{}, problem.New("invalid_state", "payment intent %s is %s and cannot be %s", intentID, current.Status, verb).
		With("status", current.Status)
}

// Captured implements Store.
func (PostgresStore) Captured(ctx context.Context, tx *gorm.DB, accountID, opID string, capturedMinor int64) (Intent, error) {
	return moveIntent(ctx, tx, "captured", `status = 'succeeded', captured_minor = ?, pending_operation_id = NULL`,
		`account_id = ? AND pending_operation_id = ? AND status = 'capturing'`, capturedMinor, accountID, opID)
}

// DuplicateCaptured implements Store.
func (PostgresStore) DuplicateCaptured(ctx context.Context, tx *gorm.DB, accountID, opID string, capturedMinor, duplicateMinor int64) (Intent, error) {
	return moveIntent(ctx, tx, "duplicate captured", `status = 'succeeded', captured_minor = ?, duplicate_captured_minor = ?,
duplicate_capture_operation_id = pending_operation_id, pending_operation_id = NULL`,
		`account_id = ? AND pending_operation_id = ? AND status = 'capturing'`, capturedMinor, duplicateMinor, accountID, opID)
}

// Canceled implements Store.
func (PostgresStore) Canceled(ctx context.Context, tx *gorm.DB, accountID, opID string) (Intent, error) {
	return moveIntent(ctx, tx, "canceled", `status = 'canceled', pending_operation_id = NULL`,
		`account_id = ? AND pending_operation_id = ? AND status = 'canceling'`, accountID, opID)
}

// Release implements Store.
func (PostgresStore) Release(ctx context.Context, tx *gorm.DB, accountID, opID string) (Intent, error) {
	return moveIntent(ctx, tx, "release", `status = 'requires_capture', pending_operation_id = NULL`,
		`account_id = ? AND pending_operation_id = ? AND status IN ('capturing', 'canceling')`, accountID, opID)
}

// ReserveRefund implements Store. The intent row lock serializes every refund reservation of one intent. The
// sum is read by a statement of its own, after the lock is held: in READ COMMITTED a statement that waited for
// a lock still reads with the snapshot it started with, so a sum read in the locking statement could miss the
// refund the previous lock holder just committed.
func (s PostgresStore) ReserveRefund(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string, cmd CreateRefund) (Refund, Intent, error) {
	return s.reserveRefund(ctx, tx, accountID, intentID, opID, cmd, false)
}

// ReserveDuplicateRefund implements Store.
func (s PostgresStore) ReserveDuplicateRefund(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string, cmd CreateRefund) (Refund, Intent, error) {
	return s.reserveRefund(ctx, tx, accountID, intentID, opID, cmd, true)
}

// heldSQL sums an intent's refunds that are not failed, of one side: those of its capture, or (second
// argument true) those that return its duplicated capture. A refund the provider executed more than once
// counts every execution.
const heldSQL = `SELECT COALESCE(sum(amount_minor * executions), 0) FROM payment_refunds
WHERE account_id = ? AND intent_id = ? AND status <> 'failed' AND returns_duplicate_capture = ?`

// reserveRefund reserves a refund of the intent's capture, or (duplicate) of what its duplicated capture took.
func (s PostgresStore) reserveRefund(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string, cmd CreateRefund, duplicate bool) (Refund, Intent, error) {
	var locked []Intent
	err := tx.WithContext(ctx).Raw(`SELECT `+intentColumns+` FROM payment_intents WHERE account_id = ? AND id = ? FOR UPDATE`,
		accountID, intentID).Scan(&locked).Error
	if err != nil {
		return Refund{}, Intent{}, fmt.Errorf("payments: reserve refund: lock intent: %w", err)
	}
	if len(locked) == 0 {
		return Refund{}, Intent{}, problem.NotFound("payment intent")
	}
	var held int64
	err = tx.WithContext(ctx).Raw(heldSQL, accountID, intentID, duplicate).Scan(&held).Error
	if err != nil {
		return Refund{}, Intent{}, fmt.Errorf("payments: reserve refund: refunded so far: %w", err)
	}
	in := locked[0]
	if in.Status != StatusSucceeded {
		return Refund{}, Intent{}, problem.New("invalid_state", "payment intent %s is %s; only a captured intent can be refunded", in.ID, in.Status).
			With("status", in.Status)
	}
	captured, what := in.CapturedMinor, "captured"
	if duplicate {
		captured, what = in.DuplicateCapturedMinor, "taken by the duplicated capture"
	}
	if available := captured - held; cmd.AmountMinor > available {
		return Refund{}, Intent{}, problem.New("amount_too_large",
			"a refund of %s %s exceeds the %s %s %s and not yet refunded or being refunded",
			format(in.Currency, cmd.AmountMinor), in.Currency, format(in.Currency, max(available, 0)), in.Currency, what).
			With("available_minor", max(available, 0))
	}
	var rows []Refund
	err = tx.WithContext(ctx).Raw(`
INSERT INTO payment_refunds (id, account_id, intent_id, currency, amount_minor, reason, status, operation_id, returns_duplicate_capture)
VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?)
RETURNING `+refundColumns, ids.New("re_"), accountID, in.ID, in.Currency, cmd.AmountMinor, cmd.Reason, opID, duplicate).Scan(&rows).Error
	if err != nil {
		return Refund{}, Intent{}, fmt.Errorf("payments: reserve refund: insert: %w", err)
	}
	return rows[0], in, nil
}

// RefundsHeld implements Store. As in ReserveRefund, the sum is a statement of its own after the lock.
func (PostgresStore) RefundsHeld(ctx context.Context, tx *gorm.DB, accountID, intentID string) (int64, error) {
	var locked []string
	err := tx.WithContext(ctx).Raw(`SELECT id FROM payment_intents WHERE account_id = ? AND id = ? FOR UPDATE`,
		accountID, intentID).Scan(&locked).Error
	if err != nil {
		return 0, fmt.Errorf("payments: refunds held: lock intent: %w", err)
	}
	if len(locked) == 0 {
		return 0, problem.NotFound("payment intent")
	}
	var held int64
	err = tx.WithContext(ctx).Raw(heldSQL, accountID, intentID, false).Scan(&held).Error
	if err != nil {
		return 0, fmt.Errorf("payments: refunds held: %w", err)
	}
	return held, nil
}

// RefundSucceeded implements Store.
func (PostgresStore) RefundSucceeded(ctx context.Context, tx *gorm.DB, accountID, opID, providerRefundID string) (Refund, error) {
	return settleRefund(ctx, tx, "refund succeeded", accountID, opID, providerRefundID, 1)
}

// RefundDuplicated implements Store.
func (PostgresStore) RefundDuplicated(ctx context.Context, tx *gorm.DB, accountID, opID, providerRefundID string, executions int) (Refund, error) {
	return settleRefund(ctx, tx, "refund duplicated", accountID, opID, providerRefundID, executions)
}

// settleRefundSQL books a pending refund the provider executed: the refund and the intent's refunded total
// change in one statement, by amount_minor for each execution. A correction of a duplicated capture returns into
// duplicate_refunded_minor up to duplicate_captured_minor; what a duplicated correction paid beyond that came out
// of the capture.
const settleRefundSQL = `
WITH r AS (
    UPDATE payment_refunds SET status = 'succeeded', provider_refund_id = ?, executions = ?, updated_at = now()
    WHERE account_id = ? AND operation_id = ? AND status = 'pending'
    RETURNING ` + refundColumns + `
), paid AS (
    SELECT r.account_id, r.intent_id, r.amount_minor * r.executions AS total,
           CASE WHEN r.returns_duplicate_capture
                THEN LEAST(r.amount_minor * r.executions, i.duplicate_captured_minor - i.duplicate_refunded_minor)
                ELSE 0 END AS to_duplicate
    FROM r JOIN payment_intents i ON i.account_id = r.account_id AND i.id = r.intent_id
), i AS (
    UPDATE payment_intents SET
        refunded_minor           = refunded_minor + paid.total - paid.to_duplicate,
        duplicate_refunded_minor = duplicate_refunded_minor + paid.to_duplicate,
        updated_at = now()
    FROM paid WHERE payment_intents.account_id = paid.account_id AND payment_intents.id = paid.intent_id
)
SELECT * FROM r`

func settleRefund(ctx context.Context, tx *gorm.DB, what, accountID, opID, providerRefundID string, executions int) (Refund, error) {
	var rows []Refund
	err := tx.WithContext(ctx).Raw(settleRefundSQL, providerRefundID, executions, accountID, opID).Scan(&rows).Error
	if err != nil {
		return Refund{}, fmt.Errorf("payments: %s: %w", what, err)
	}
	if len(rows) == 0 {
		return Refund{}, fmt.Errorf("payments: %s: %w", what, ErrNotReserved)
	}
	return rows[0], nil
}

// RefundFailed implements Store.
func (PostgresStore) RefundFailed(ctx context.Context, tx *gorm.DB, accountID, opID string) (Refund, error) {
	var rows []Refund
	err := tx.WithContext(ctx).Raw(`UPDATE payment_refunds SET status = 'failed', updated_at = now()
WHERE account_id = ? AND operation_id = ? AND status = 'pending' RETURNING `+refundColumns, accountID, opID).Scan(&rows).Error
	if err != nil {
		return Refund{}, fmt.Errorf("payments: refund failed: %w", err)
	}
	if len(rows) == 0 {
		return Refund{}, fmt.Errorf("payments: refund failed: %w", ErrNotReserved)
	}
	return rows[0], nil
}

// Intent implements Store.
func (PostgresStore) Intent(ctx context.Context, db *gorm.DB, accountID, id string) (Intent, error) {
	var rows []Intent
	err := db.WithContext(ctx).Raw(`SELECT `+intentColumns+` FROM payment_intents WHERE account_id = ? AND id = ?`,
		accountID, id).Scan(&rows).Error
	if err != nil {
		return Intent{}, fmt.Errorf("payments: get intent: %w", err)
	}
	if len(rows) == 0 {
		return Intent{}, problem.NotFound("payment intent")
	}
	return rows[0], nil
}

// Refund implements Store.
func (PostgresStore) Refund(ctx context.Context, db *gorm.DB, accountID, id string) (Refund, error) {
	var rows []Refund
	err := db.WithContext(ctx).Raw(`SELECT `+refundColumns+` FROM payment_refunds WHERE account_id = ? AND id = ?`,
		accountID, id).Scan(&rows).Error
	if err != nil {
		return Refund{}, fmt.Errorf("payments: get refund: %w", err)
	}
	if len(rows) == 0 {
		return Refund{}, problem.NotFound("refund")
	}
	return rows[0], nil
}

// Refunds implements Store.
func (s PostgresStore) Refunds(ctx context.Context, db *gorm.DB, accountID, intentID string, p page.Request) ([]Refund, error) {
	if _, err := s.Intent(ctx, db, accountID, intentID); err != nil {
		return nil, err
	}
	q := db.WithContext(ctx).Table("payment_refunds").Select(refundColumns).Where("account_id = ? AND intent_id = ?", accountID, intentID)
	if p.After != nil {
		q = q.Where("(created_at, id) > (?, ?)", p.After.At, p.After.ID)
	}
	rows := []Refund{}
	err := q.Order("created_at, id").Limit(p.Fetch()).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("payments: list refunds: %w", err)
	}
	return rows, nil
}
