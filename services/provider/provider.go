// Package provider is the payment provider sandbox: a small card-payment API
// of our own that the payments service calls over real HTTP, the way it would
// call Stripe or Adyen, plus the Go client payments uses to call it.
//
// The sandbox exists so the hard part of payments can be tested for real: a
// provider that executes a charge and then loses the answer. With
// Config.FaultInjection set, a test arms faults per call kind (fail before
// executing, drop the connection after executing, answer too late) and reads
// how many times each kind really executed:
//
//	srv := httptest.NewServer(provider.NewServer(provider.Config{FaultInjection: true}, logger).Handler())
//	c := provider.NewClient(srv.URL, "sk_test_merchant", 2*time.Second)
//	_ = c.InjectFault(ctx, provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDrop, Count: 1})
//	_, err := c.Capture(ctx, "key-1", authID, 500)
//	// errors.Is(err, provider.ErrOutcomeUnknown): the capture ran, the answer was lost.
//	res, _ := c.Lookup(ctx, "key-1") // res.Found, res.Status == 200, res.Body is the capture
//
// Every POST under /v1 takes an Idempotency-Key; the provider stores each
// answer under (merchant, key) and replays it, so a retry with the same key
// never executes twice. The merchant is whoever holds the bearer secret: any
// non-empty secret is a merchant, with its own authorizations, keys, counters
// and faults. State lives in memory and dies with the process.
package provider

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Kind names a kind of provider call, as counted by /admin/counters and
// targeted by faults.
type Kind string

// The kinds of calls that change state.
const (
	KindAuthorize Kind = "authorize"
	KindCapture   Kind = "capture"
	KindVoid      Kind = "void"
	KindRefund    Kind = "refund"
)

var kinds = []Kind{KindAuthorize, KindCapture, KindVoid, KindRefund}

// Authorization statuses. An authorization is captured or voided at most once;
// a partial capture releases the rest of the authorized amount.
const (
	StatusAuthorized = "authorized"
	StatusCaptured   = "captured"
	StatusVoided     = "voided"
)

// StatusSucceeded is the status of every capture and refund the sandbox makes.
const StatusSucceeded = "succeeded"

// AuthorizeRequest is the body of POST /v1/authorizations.
type AuthorizeRequest struct {
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference,omitempty"` // the caller's own id, echoed back
	// Metadata are the caller's labels, echoed back and listed with the authorization's effects (GET
	// /v1/effects): at most maxMetadata entries of short text.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Authorization is a hold on a card for an amount, later captured or voided.
type Authorization struct {
	ID            string            `json:"id"` // "auth_..."
	Status        string            `json:"status"`
	AmountMinor   int64             `json:"amount_minor"`
	Currency      string            `json:"currency"`
	CapturedMinor int64             `json:"captured_minor"`
	RefundedMinor int64             `json:"refunded_minor"`
	Reference     string            `json:"reference"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// Capture moves authorized money to the merchant.
type Capture struct {
	ID              string `json:"id"` // "cap_..."
	AuthorizationID string `json:"authorization_id"`
	AmountMinor     int64  `json:"amount_minor"`
	Status          string `json:"status"`
}

// Refund returns captured money to the card holder.
type Refund struct {
	ID              string `json:"id"` // "ref_..."
	AuthorizationID string `json:"authorization_id"`
	AmountMinor     int64  `json:"amount_minor"`
	Status          string `json:"status"`
}

// LookupResult is the stored answer of the call made with an idempotency key,
// as returned by GET /v1/idempotency/{key}. Found is false (and the rest
// empty) when the provider never executed a call with the key.
type LookupResult struct {
	Found  bool            `json:"-"`
	Key    string          `json:"key"`
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
	// Effects are the ids of what the call created or changed, one per
	// execution: more than one means the call executed more than once.
	Effects []string `json:"effects"`
}

// Effect is one call the provider executed under an idempotency key with a success, as listed by GET
// /v1/effects: what a caller that lost its own record of the call (its database went back in time) can rebuild
// it from.
type Effect struct {
	Key  string `json:"key"`
	Kind Kind   `json:"kind"`
	// AuthorizationID is the authorization the call created (authorize) or acted on.
	AuthorizationID string `json:"authorization_id"`
	Status          int    `json:"status"`
	// Body is the stored answer: the Authorization, Capture or Refund the call returned.
	Body json.RawMessage `json:"body"`
	// Effects are the ids of what the call created or changed, one per execution (LookupResult.Effects).
	Effects    []string  `json:"effects"`
	ExecutedAt time.Time `json:"executed_at"`
	// Authorization is the authorization as it stands now, after every call on it.
	Authorization Authorization `json:"authorization"`
}

// FaultMode is what an armed fault does to a call.
type FaultMode string

const (
	// FaultFail answers 503 provider_unavailable without executing anything.
	FaultFail FaultMode = "fail"
	// FaultDrop executes the call, stores its answer under the idempotency key,
	// then closes the connection without answering.
	FaultDrop FaultMode = "drop"
	// FaultDelay executes the call, stores its answer, then waits DelayMS
	// before answering (or until the caller gives up).
	FaultDelay FaultMode = "delay"
	// FaultDuplicate is a provider bug on purpose: it executes the call twice
	// (two authorizations, two refunds; a capture takes its amount twice from
	// the authorization), stores the first answer under the
	// key with both effects (LookupResult.Effects), and closes the connection
	// without answering.
	FaultDuplicate FaultMode = "duplicate"
)

// Fault is the body of POST /admin/faults: the next Count executions of Kind
// for this merchant suffer Mode. Replays of a stored key are never affected.
type Fault struct {
	Kind    Kind      `json:"kind"`
	Mode    FaultMode `json:"mode"`
	Count   int       `json:"count"`
	DelayMS int       `json:"delay_ms,omitempty"` // required for FaultDelay
}

// maxFaultDelayMS bounds FaultDelay so a typo cannot hang a test run for hours.
const maxFaultDelayMS = 10 * 60 * 1000

// ErrOutcomeUnknown reports a call that may or may not have executed: a
// timeout, a dropped connection, a 5xx, an answer that could not be read.
// The caller must not assume either outcome; it retries with the same
// idempotency key or asks Client.Lookup.
var ErrOutcomeUnknown = errors.New("provider: outcome unknown")

// Error is a definite answer from the provider that the call was refused
// (a 4xx problem response): nothing was executed by this call.
// A 5xx is never a definite refusal; its *Error is wrapped together with
// ErrOutcomeUnknown.
type Error struct {
	Status int    // HTTP status
	Code   string // machine-readable code, such as "already_captured"
	Detail string // for humans
}

func (e *Error) Error() string {
	return fmt.Sprintf("provider: %d %s: %s", e.Status, e.Code, e.Detail)
}

// Problem codes the provider answers with.
const (
	CodeUnauthorized          = "unauthorized"
	CodeIdempotencyKeyMissing = "idempotency_key_missing"
	CodeIdempotencyKeyInvalid = "idempotency_key_invalid"
	CodeIdempotencyKeyReused  = "idempotency_key_reused"
	CodeInvalidRequest        = "invalid_request"
	CodeValidationFailed      = "validation_failed"
	CodeNotFound              = "not_found"
	CodeAlreadyCaptured       = "already_captured"
	CodeInvalidState          = "invalid_state"
	CodeAmountTooLarge        = "amount_too_large"
	CodeRequestInProgress     = "request_in_progress"
	CodeProviderUnavailable   = "provider_unavailable"
	CodeInternal              = "internal_error"
)
