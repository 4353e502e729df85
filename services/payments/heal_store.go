package payments

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/services/provider"
)

// The sweep's statements (heal.go), on payments' own tables.

// readSweep reads what the last sweep stored; Found false before the first.
func readSweep(ctx context.Context, db *gorm.DB) (sweepState, error) {
	var rows []sweepState
	err := db.WithContext(ctx).Raw(`SELECT timeline_id AS timeline, matched_until, true AS found FROM payment_provider_sweep`).
		Scan(&rows).Error
	if err != nil {
		return sweepState{}, fmt.Errorf("payments: read sweep: %w", err)
	}
	if len(rows) == 0 {
		return sweepState{}, nil
	}
	return rows[0], nil
}

// writeSweep stores the timeline a sweep ran on and the provider time through which it matched every effect.
func writeSweep(ctx context.Context, db *gorm.DB, timeline int64, matchedUntil time.Time) error {
	err := db.WithContext(ctx).Exec(`
INSERT INTO payment_provider_sweep (timeline_id, matched_until) VALUES (?, ?)
ON CONFLICT (singleton) DO UPDATE SET timeline_id = excluded.timeline_id, matched_until = excluded.matched_until, swept_at = now()`,
		timeline, matchedUntil).Error
	if err != nil {
		return fmt.Errorf("payments: write sweep: %w", err)
	}
	return nil
}

// currentTimeline is the timeline of the database's last checkpoint: a promoted standby starts a new one (its
// first checkpoint after promotion records it).
func currentTimeline(ctx context.Context, db *gorm.DB) (int64, error) {
	var timeline int64
	if err := db.WithContext(ctx).Raw(`SELECT timeline_id FROM pg_control_checkpoint()`).Scan(&timeline).Error; err != nil {
		return 0, fmt.Errorf("payments: database timeline: %w", err)
	}
	return timeline, nil
}

// lockIntentByAuthorization locks the account's intent of a provider authorization.
func lockIntentByAuthorization(ctx context.Context, tx *gorm.DB, accountID, authID string) (Intent, bool, error) {
	var rows []Intent
	err := tx.WithContext(ctx).Raw(`SELECT `+intentColumns+` FROM payment_intents
WHERE account_id = ? AND provider_authorization_id = ? FOR UPDATE`, accountID, authID).Scan(&rows).Error
	if err != nil || len(rows) == 0 {
		return Intent{}, false, wrapSweep("intent of authorization", err)
	}
	return rows[0], true, nil
}

// activeIntentOfOrder is the account's active intent of the order, if any.
func activeIntentOfOrder(ctx context.Context, tx *gorm.DB, accountID, orderID string) (Intent, bool, error) {
	var rows []Intent
	err := tx.WithContext(ctx).Raw(`SELECT `+intentColumns+` FROM payment_intents
WHERE account_id = ? AND order_id = ? AND status NOT IN ('failed', 'canceled') FOR UPDATE`, accountID, orderID).Scan(&rows).Error
	if err != nil || len(rows) == 0 {
		return Intent{}, false, wrapSweep("active intent of order", err)
	}
	return rows[0], true, nil
}

// restoreIntent inserts the intent of authorization a, authorized (requires_capture), created by restore
// operation opID.
func restoreIntent(ctx context.Context, tx *gorm.DB, accountID, opID string, a provider.Authorization) (Intent, error) {
	var rows []Intent
	err := tx.WithContext(ctx).Raw(`
INSERT INTO payment_intents (id, account_id, order_id, currency, amount_minor, status, provider_authorization_id, create_operation_id)
VALUES (?, ?, ?, ?, ?, 'requires_capture', ?, ?)
RETURNING `+intentColumns, ids.New("pi_"), accountID, a.Reference, a.Currency, a.AmountMinor, a.ID, opID).Scan(&rows).Error
	if err != nil {
		return Intent{}, wrapSweep("restore intent", err)
	}
	return rows[0], nil
}

// restoreSettlement moves an intent in requires_capture to succeeded with capturedMinor, or (voided) to canceled.
func restoreSettlement(ctx context.Context, tx *gorm.DB, accountID, intentID string, capturedMinor int64, voided bool) (Intent, error) {
	set, args := `status = 'succeeded', captured_minor = ?`, []any{capturedMinor}
	if voided {
		set, args = `status = 'canceled'`, nil
	}
	return moveIntent(ctx, tx, "restore settlement", set, `account_id = ? AND id = ? AND status = 'requires_capture'`,
		append(args, accountID, intentID)...)
}

// refundKnown reports whether the intent has a refund of provider id providerRefundID, and whether it has a
// pending refund (one whose provider call is out).
func refundKnown(ctx context.Context, tx *gorm.DB, accountID, intentID, providerRefundID string) (known, pending bool, err error) {
	var row struct{ Known, Pending bool }
	err = tx.WithContext(ctx).Raw(`SELECT
  COALESCE(bool_or(provider_refund_id = ?), false) AS known,
  COALESCE(bool_or(status = 'pending'), false) AS pending
FROM payment_refunds WHERE account_id = ? AND intent_id = ?`, providerRefundID, accountID, intentID).Scan(&row).Error
	return row.Known, row.Pending, wrapSweep("refunds of intent", err)
}

// restoreRefund inserts the succeeded refund the provider paid on the intent, by restore operation opID, and adds
// it to the intent's refunded total.
func restoreRefund(ctx context.Context, tx *gorm.DB, accountID, opID string, in Intent, paid provider.Refund) (Refund, error) {
	var rows []Refund
	err := tx.WithContext(ctx).Raw(`
WITH r AS (
    INSERT INTO payment_refunds (id, account_id, intent_id, currency, amount_minor, status, provider_refund_id, operation_id)
    VALUES (?, ?, ?, ?, ?, 'succeeded', ?, ?)
    RETURNING `+refundColumns+`
), i AS (
    UPDATE payment_intents SET refunded_minor = refunded_minor + (SELECT amount_minor FROM r), updated_at = now()
    WHERE account_id = ? AND id = ?
)
SELECT * FROM r`, ids.New("re_"), accountID, in.ID, in.Currency, paid.AmountMinor, paid.ID, opID, accountID, in.ID).Scan(&rows).Error
	if err != nil {
		return Refund{}, wrapSweep("restore refund", err)
	}
	return rows[0], nil
}

func wrapSweep(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("payments: sweep: %s: %w", what, err)
}

// recordRestored stores which provider key's effect restore operation opID rebuilt as the resource.
func recordRestored(ctx context.Context, tx *gorm.DB, accountID, providerKey, opID, resourceType, resourceID string) error {
	err := tx.WithContext(ctx).Exec(`INSERT INTO payment_restored_effects (account_id, provider_key, operation_id, resource_type, resource_id)
VALUES (?, ?, ?, ?, ?)`, accountID, providerKey, opID, resourceType, resourceID).Error
	return wrapSweep("record restored effect", err)
}

// restoredResource names what was restored of a provider call.
type restoredResource struct {
	ResourceType, ResourceID string
}

// adoptRestoredEffect makes operation opID the adopter of what was restored from providerKey's call; found
// false when nothing was.
func adoptRestoredEffect(ctx context.Context, tx *gorm.DB, accountID, providerKey, opID string) (restoredResource, bool, error) {
	var rows []restoredResource
	err := tx.WithContext(ctx).Raw(`UPDATE payment_restored_effects SET adopted_by = ?
WHERE account_id = ? AND provider_key = ? RETURNING resource_type, resource_id`, opID, accountID, providerKey).Scan(&rows).Error
	if err != nil || len(rows) == 0 {
		return restoredResource{}, false, wrapSweep("adopt restored effect", err)
	}
	return rows[0], true, nil
}

// adoptedResource is what operation opID adopted; found false when it adopted nothing.
func adoptedResource(ctx context.Context, tx *gorm.DB, accountID, opID string) (restoredResource, bool, error) {
	var rows []restoredResource
	err := tx.WithContext(ctx).Raw(`SELECT resource_type, resource_id FROM payment_restored_effects
WHERE account_id = ? AND adopted_by = ?`, accountID, opID).Scan(&rows).Error
	if err != nil || len(rows) == 0 {
		return restoredResource{}, false, wrapSweep("adopted resource", err)
	}
	return rows[0], true, nil
}
