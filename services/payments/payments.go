// Package payments is the payments service of retrysafe: payment intents authorized at a card provider,
// captured once by an explicit action, cancelled (voided) before capture, and refunded up to what was captured,
// every write safe for an AI agent to retry.
//
// Money leaves our database here and cannot be rolled back, so every write runs in idem's external mode: the
// claim commits with a reservation of the intent (Prepare), the provider is called with a downstream
// Idempotency-Key derived from the account and the caller's Idempotency-Key (DownstreamKey), and the answer is
// recorded after. When the answer is lost the operation is unknown; the reconciler of its kind asks the provider
// what it did under that key and records the same outcome through the same code as the handler.
//
// This file holds the domain: types, the commands the service accepts, and the store interface. store.go
// implements the store on gorm + PostgreSQL; http.go and routes.go are the HTTP adapter; reconcile.go settles
// unknown operations.
package payments

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/money"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/services/provider"
)

// Operation kinds, one reconciler each.
const (
	KindCreateIntent = "payments.create_intent"
	KindCapture      = "payments.capture"
	KindCancel       = "payments.cancel"
	KindRefund       = "payments.refund"
)

// DownstreamKey is the provider Idempotency-Key of op, the first operation under its key: a digest of its
// account and the caller's Idempotency-Key, so that every retry, restart, worker and reconciler of one request
// names the same provider call. It does not depend on the operation id, which a database failover can take
// away: when the newest commits are lost with the old primary (an asynchronous standby promoted), a retry claims
// the key again under a new operation, and its provider call still replays the first one's instead of
// authorizing or capturing twice. The digest keeps the account and the caller's key from the provider.
//
// A key sent again after its lifetime names a new action (downstreamKey): its provider key is derived from the
// operation that held the key before too.
func DownstreamKey(op opstatus.Operation) string {
	return downstreamKeyAfter(op, "")
}

// downstreamKeyAfter is the provider key of op when predecessor (opstore.KeyPredecessor) held its key before
// and gave it up at the end of its lifetime; DownstreamKey when none did.
func downstreamKeyAfter(op opstatus.Operation, predecessor string) string {
	in := op.AccountID + "\x00" + op.IdempotencyKey
	if predecessor != "" {
		in += "\x00" + predecessor
	}
	sum := sha256.Sum256([]byte(in))
	return "rsk-" + hex.EncodeToString(sum[:])
}

// operationDownstreamKey is the provider key that operations dispatched before DownstreamKey existed went out
// under; their reconcilers look it up when the derived key is not found.
func operationDownstreamKey(opID string) string { return "rs-" + opID }

// IntentStatus is where a payment intent stands.
type IntentStatus string

const (
	// StatusAuthorizing: the authorization is being placed at the provider.
	StatusAuthorizing IntentStatus = "authorizing"
	// StatusRequiresCapture: authorized; waiting for an explicit capture or cancel.
	StatusRequiresCapture IntentStatus = "requires_capture"
	// StatusCapturing and StatusCanceling: a capture or void is at the provider; the intent is reserved for it.
	StatusCapturing IntentStatus = "capturing"
	StatusCanceling IntentStatus = "canceling"
	// StatusSucceeded: captured (the rest of a partial capture is released). Refunds may follow.
	StatusSucceeded IntentStatus = "succeeded"
	// StatusCanceled: voided before capture.
	StatusCanceled IntentStatus = "canceled"
	// StatusFailed: the authorization was refused or never reached the provider.
	StatusFailed IntentStatus = "failed"
)

// Intent is a payment intent: an amount authorized for one order, captured at most once.
type Intent struct {
	ID                      string       `json:"id"`
	AccountID               string       `json:"-"`
	OrderID                 string       `json:"order_id"`
	Currency                string       `json:"currency"`
	AmountMinor             int64        `json:"amount_minor"`
	Description             string       `json:"description"`
	Status                  IntentStatus `json:"status"`
	CapturedMinor           int64        `json:"captured_minor"`
	RefundedMinor           int64        `json:"refunded_minor"`
	ProviderAuthorizationID *string      `json:"provider_authorization_id"`
	// DuplicateCaptureOperationID is the capture the provider executed more than once, once a correction named
	// it; DuplicateCapturedMinor what its further executions took beyond CapturedMinor, and
	// DuplicateRefundedMinor what corrections returned of it (services/schema/00001_baseline.sql).
	DuplicateCaptureOperationID *string   `json:"duplicate_capture_operation_id,omitempty"`
	DuplicateCapturedMinor      int64     `json:"duplicate_captured_minor"`
	DuplicateRefundedMinor      int64     `json:"duplicate_refunded_minor"`
	CreatedAt                   time.Time `json:"created_at"`
	UpdatedAt                   time.Time `json:"updated_at"`
}

// MarshalJSON adds the formatted amounts ("12.30") beside the minor units.
func (i Intent) MarshalJSON() ([]byte, error) {
	type plain Intent
	return json.Marshal(struct {
		plain
		Amount            string `json:"amount"`
		Captured          string `json:"captured"`
		Refunded          string `json:"refunded"`
		DuplicateCaptured string `json:"duplicate_captured"`
		DuplicateRefunded string `json:"duplicate_refunded"`
	}{plain(i), format(i.Currency, i.AmountMinor), format(i.Currency, i.CapturedMinor), format(i.Currency, i.RefundedMinor),
		format(i.Currency, i.DuplicateCapturedMinor), format(i.Currency, i.DuplicateRefundedMinor)})
}

// RefundStatus is where a refund stands: pending holds its amount against the captured total until the
// provider's answer is recorded.
type RefundStatus string

const (
	RefundPending   RefundStatus = "pending"
	RefundSucceeded RefundStatus = "succeeded"
	RefundFailed    RefundStatus = "failed"
)

// Refund returns captured money. Each refund instruction is its own operation.
type Refund struct {
	ID               string       `json:"id"`
	AccountID        string       `json:"-"`
	IntentID         string       `json:"intent_id"`
	Currency         string       `json:"currency"`
	AmountMinor      int64        `json:"amount_minor"`
	Reason           string       `json:"reason"`
	Status           RefundStatus `json:"status"`
	ProviderRefundID *string      `json:"provider_refund_id"`
	// ReturnsDuplicateCapture: a correction that returns what a duplicated capture took beyond the intent's
	// capture; it counts against the intent's duplicate_captured_minor, not its captured_minor.
	ReturnsDuplicateCapture bool `json:"returns_duplicate_capture"`
	// Executions is how many times the provider executed the refund: more than one when it paid it out twice
	// (its operation duplicate_effect_confirmed), each execution booked in the intent's refunded total
	// (services/schema, payment_refunds.executions).
	Executions int       `json:"executions"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// MarshalJSON adds the formatted amount.
func (r Refund) MarshalJSON() ([]byte, error) {
	type plain Refund
	return json.Marshal(struct {
		plain
		Amount string `json:"amount"`
	}{plain(r), format(r.Currency, r.AmountMinor)})
}

func format(currency string, minor int64) string {
	return money.Amount{Currency: currency, Minor: minor}.String()
}

// Requests are the bodies as sent, decoded strictly: amount is a decimal string, amount_minor an integer, so a
// JSON number with a fraction (or a number for amount) is a 400 before anything else. Their Command methods
// return the validated commands below, which is what the fingerprint covers: "12.3", "12.30" and amount_minor
// 1230 in USD are one command.

// CreateIntentRequest is the body of POST /v1/payment_intents.
type CreateIntentRequest struct {
	OrderID     string  `json:"order_id"`
	Amount      *string `json:"amount"`
	AmountMinor *int64  `json:"amount_minor"`
	Currency    string  `json:"currency"`
	Description *string `json:"description"`
}

// CreateIntent is the validated command of POST /v1/payment_intents.
type CreateIntent struct {
	OrderID     string `json:"order_id"`
	Currency    string `json:"currency"`
	AmountMinor int64  `json:"amount_minor"`
	Description string `json:"description"`
}

// Command validates the request.
func (r CreateIntentRequest) Command() (CreateIntent, error) {
	var errs []problem.FieldError
	errs = problem.CheckText(errs, "order_id", r.OrderID, 255, true)
	desc := ""
	if r.Description != nil {
		desc = *r.Description
		errs = problem.CheckText(errs, "description", desc, 1000, false)
	}
	a, err := money.Resolve(r.Currency, r.Amount, r.AmountMinor)
	errs = appendMoneyError(errs, err)
	switch {
	case len(errs) > 0:
		return CreateIntent{}, problem.Validation(errs...)
	case err != nil:
		return CreateIntent{}, err
	}
	return CreateIntent{OrderID: r.OrderID, Currency: a.Currency, AmountMinor: a.Minor, Description: desc}, nil
}

// CaptureRequest is the body of POST /v1/payment_intents/{id}/capture; without an amount the whole authorized
// amount is captured.
type CaptureRequest struct {
	Amount      *string `json:"amount"`
	AmountMinor *int64  `json:"amount_minor"`
}

// Capture is the validated command of a capture, with the default amount applied.
type Capture struct {
	Currency    string `json:"currency"`
	AmountMinor int64  `json:"amount_minor"`
}

// Command validates the request against the intent it captures: the currency (and so the decimals) is the
// intent's, and a capture may not exceed the authorized amount.
func (r CaptureRequest) Command(in Intent) (Capture, error) {
	if r.Amount == nil && r.AmountMinor == nil {
		return Capture{Currency: in.Currency, AmountMinor: in.AmountMinor}, nil
	}
	a, err := resolveIn(in.Currency, r.Amount, r.AmountMinor)
	if err != nil {
		return Capture{}, err
	}
	if a.Minor > in.AmountMinor {
		return Capture{}, problem.New("amount_too_large", "a capture of %s %s exceeds the authorized %s %s",
			a, a.Currency, format(in.Currency, in.AmountMinor), in.Currency).With("authorized_minor", in.AmountMinor)
	}
	return Capture{Currency: a.Currency, AmountMinor: a.Minor}, nil
}

// CancelRequest is the body of POST /v1/payment_intents/{id}/cancel: empty, or {}.
type CancelRequest struct{}

// Cancel is the validated command of a cancel.
type Cancel struct{}

// CreateRefundRequest is the body of POST /v1/payment_intents/{id}/refunds.
type CreateRefundRequest struct {
	Amount      *string `json:"amount"`
	AmountMinor *int64  `json:"amount_minor"`
	Reason      *string `json:"reason"`
}

// CreateRefund is the validated command of a refund.
type CreateRefund struct {
	Currency    string `json:"currency"`
	AmountMinor int64  `json:"amount_minor"`
	Reason      string `json:"reason"`
}

// Command validates the request in the intent's currency. Whether the amount is still refundable is decided
// under a lock when the refund is reserved, not here.
func (r CreateRefundRequest) Command(in Intent) (CreateRefund, error) {
	var errs []problem.FieldError
	reason := ""
	if r.Reason != nil {
		reason = *r.Reason
		errs = problem.CheckText(errs, "reason", reason, 500, false)
	}
	a, err := resolveIn(in.Currency, r.Amount, r.AmountMinor)
	var fe *problem.Error
	if errors.As(err, &fe) {
		errs = append(errs, fe.Fields...)
	} else if err != nil {
		return CreateRefund{}, err
	}
	if len(errs) > 0 {
		return CreateRefund{}, problem.Validation(errs...)
	}
	return CreateRefund{Currency: a.Currency, AmountMinor: a.Minor, Reason: reason}, nil
}

// resolveIn resolves an amount in a currency the caller did not send (the intent's).
func resolveIn(currency string, amount *string, amountMinor *int64) (money.Amount, error) {
	a, err := money.Resolve(currency, amount, amountMinor)
	if errs := appendMoneyError(nil, err); len(errs) > 0 {
		return money.Amount{}, problem.Validation(errs...)
	}
	return a, err
}

func appendMoneyError(errs []problem.FieldError, err error) []problem.FieldError {
	var fe *money.FieldError
	if errors.As(err, &fe) {
		return append(errs, problem.FieldError{Field: fe.Field, Message: fe.Message})
	}
	return errs
}

// ErrNotReserved is returned by the store's Finish and Release methods when the operation no longer holds the
// row it reserved: another worker recorded its outcome first.
var ErrNotReserved = errors.New("payments: operation holds no reservation")

// Store keeps intents and refunds. Methods that reserve or record take the caller's transaction: the
// reservation commits with the idempotency claim, the outcome with the stored response. Reads are scoped to an
// account; Finish and Release methods find their row by the operation that reserved it, in its account.
type Store interface {
	// BeginIntent inserts an intent in status authorizing for operation opID. When the account already has an
	// active intent (not failed, not canceled) for the order, also one inserted concurrently, it returns a 409
	// order_has_active_intent *problem.Error with existing_intent_id.
	BeginIntent(ctx context.Context, tx *gorm.DB, accountID, opID string, cmd CreateIntent) (Intent, error)
	// Authorized moves the intent of create operation opID from authorizing to requires_capture.
	Authorized(ctx context.Context, tx *gorm.DB, accountID, opID, authorizationID string) (Intent, error)
	// AuthorizationFailed moves the intent of create operation opID from authorizing to failed, which frees its order.
	AuthorizationFailed(ctx context.Context, tx *gorm.DB, accountID, opID string) (Intent, error)

	// BeginCapture reserves an intent in requires_capture for capture operation opID (status capturing), with
	// one conditional statement: of concurrent captures exactly one passes. Others get a 409 invalid_state
	// *problem.Error; an intent missing from the account matches problem.ErrNotFound.
	BeginCapture(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string) (Intent, error)
	// Captured moves the intent reserved by opID from capturing to succeeded with captured_minor.
	Captured(ctx context.Context, tx *gorm.DB, accountID, opID string, capturedMinor int64) (Intent, error)
	// BeginCancel reserves an intent in requires_capture for cancel operation opID (status canceling); errors
	// as BeginCapture.
	BeginCancel(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string) (Intent, error)
	// Canceled moves the intent reserved by opID from canceling to canceled.
	Canceled(ctx context.Context, tx *gorm.DB, accountID, opID string) (Intent, error)
	// Release returns the intent reserved by capture or cancel operation opID to requires_capture: the provider
	// refused the call or never executed it.
	Release(ctx context.Context, tx *gorm.DB, accountID, opID string) (Intent, error)

	// ReserveRefund locks the intent, checks that captured minus every refund of the capture not failed (a
	// correction returning a duplicated capture is not one) covers cmd.AmountMinor
	// (else 422 amount_too_large) and inserts a pending refund for operation opID. It returns the refund and the
	// intent. An intent that is not succeeded is a 409 invalid_state.
	ReserveRefund(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string, cmd CreateRefund) (Refund, Intent, error)
	// DuplicateCaptured records the capture opID the provider executed more than once, found reserving its
	// intent (capturing): the intent is captured with capturedMinor (one execution) and duplicateMinor (what
	// the further executions took). ErrNotReserved when opID reserves no intent.
	DuplicateCaptured(ctx context.Context, tx *gorm.DB, accountID, opID string, capturedMinor, duplicateMinor int64) (Intent, error)
	// ReserveDuplicateRefund is ReserveRefund for a correction that returns what the duplicated capture of the
	// intent took: it checks cmd.AmountMinor against duplicate_captured_minor minus such refunds not failed, and
	// inserts the refund with returns_duplicate_capture.
	ReserveDuplicateRefund(ctx context.Context, tx *gorm.DB, accountID, intentID, opID string, cmd CreateRefund) (Refund, Intent, error)
	// RefundsHeld locks the intent (FOR UPDATE, in tx when tx is a transaction) and returns the sum of its
	// refunds of the capture that are not failed: succeeded and pending. Returns problem.ErrNotFound.
	RefundsHeld(ctx context.Context, tx *gorm.DB, accountID, intentID string) (int64, error)
	// RefundSucceeded marks the pending refund of opID succeeded and adds it to the intent's refunded_minor (its
	// duplicate_refunded_minor for a refund that returns a duplicated capture, up to duplicate_captured_minor).
	RefundSucceeded(ctx context.Context, tx *gorm.DB, accountID, opID, providerRefundID string) (Refund, error)
	// RefundDuplicated books the pending refund of opID that the provider executed executions times (more than
	// once): succeeded under the first execution's providerRefundID, with each execution added to the intent's
	// refunded total. ErrNotReserved when opID holds no pending refund.
	RefundDuplicated(ctx context.Context, tx *gorm.DB, accountID, opID, providerRefundID string, executions int) (Refund, error)
	// RefundFailed marks the pending refund of opID failed, which releases its amount.
	RefundFailed(ctx context.Context, tx *gorm.DB, accountID, opID string) (Refund, error)

	// Intent returns an intent. Returns an error matching problem.ErrNotFound if it does not exist in the account.
	Intent(ctx context.Context, db *gorm.DB, accountID, id string) (Intent, error)
	// Refund returns a refund. Returns an error matching problem.ErrNotFound if it does not exist in the account.
	Refund(ctx context.Context, db *gorm.DB, accountID, id string) (Refund, error)
	// Refunds lists an intent's refunds, oldest first. Returns an error matching problem.ErrNotFound if the
	// intent does not exist in the account.
	// At most p.Fetch() of them, after p.After.
	Refunds(ctx context.Context, db *gorm.DB, accountID, intentID string, p page.Request) ([]Refund, error)
}

// Provider is the payment provider as payments uses it; *provider.Client implements it. Its errors follow
// provider.Client: provider.ErrOutcomeUnknown when the call may or may not have executed, a *provider.Error
// when it was refused.
type Provider interface {
	Authorize(ctx context.Context, key string, req provider.AuthorizeRequest) (provider.Authorization, error)
	Capture(ctx context.Context, key, authID string, amountMinor int64) (provider.Capture, error)
	Void(ctx context.Context, key, authID string) (provider.Authorization, error)
	Refund(ctx context.Context, key, authID string, amountMinor int64) (provider.Refund, error)
	Lookup(ctx context.Context, key string) (provider.LookupResult, error)
	Effects(ctx context.Context, since time.Time) ([]provider.Effect, error)
}

var _ Provider = (*provider.Client)(nil)
