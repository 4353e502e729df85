// Package problem is the one place where retrysafe turns errors into HTTP answers.
//
// Handlers and stores return errors; they never pick a status code. A domain error is a *Error carrying a Code
// from the table below; Write maps it to an RFC 9457 application/problem+json response. Anything else becomes a
// generic 500 for the client and a structured log line for the operator, except a lost database connection,
// which becomes 503 store_unavailable (fail closed).
//
//	if t, err := store.Ticket(ctx, account, id); err != nil {
//		problem.Write(c, err) // ErrNotFound wrapped anywhere in err -> 404 not_found
//	}
package problem

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Code is the machine-readable name of a problem, the `code` member of every error response.
type Code string

// The codes of docs/contract.md, each with its status there. Add a code here, and there, when a service needs one.
const (
	CodeInvalidRequest        Code = "invalid_request"
	CodeValidationFailed      Code = "validation_failed"
	CodeUnauthorized          Code = "unauthorized"
	CodeForbidden             Code = "forbidden"
	CodeNotFound              Code = "not_found"
	CodeMethodNotAllowed      Code = "method_not_allowed"
	CodeBodyTooLarge          Code = "body_too_large"
	CodeUnsupportedMediaType  Code = "unsupported_media_type"
	CodeIdempotencyKeyMissing Code = "idempotency_key_missing"
	CodeIdempotencyKeyInvalid Code = "idempotency_key_invalid"
	CodeIdempotencyKeyReused  Code = "idempotency_key_reused"
	CodeRequestInProgress     Code = "request_in_progress"
	// CodeIdempotencyResponseExpired: the key's stored response was pruned after its retention; the key still
	// lives, so the request is not run again: the answer names the operation and its resource.
	CodeIdempotencyResponseExpired Code = "idempotency_response_expired"
	// CodeSupersededOperationUnknown: Supersedes-Operation-Id names an operation whose outcome is unknown.
	CodeSupersededOperationUnknown Code = "superseded_operation_unknown"
	CodeOutcomeUnknown             Code = "outcome_unknown"
	CodeStoreUnavailable           Code = "store_unavailable"
	CodeRateLimited                Code = "rate_limited"
	CodeInternal                   Code = "internal"

	CodeApprovalRequired Code = "approval_required"
	CodeApprovalInvalid  Code = "approval_invalid"

	// payments
	CodeOrderHasActiveIntent Code = "order_has_active_intent"
	CodeInvalidState         Code = "invalid_state"
	CodeAmountTooLarge       Code = "amount_too_large"
	CodeProviderDeclined     Code = "provider_declined"
	CodeProviderUnavailable  Code = "provider_unavailable"
	CodeDuplicateEffect      Code = "duplicate_effect_confirmed"
	// CodeAlreadyRemediated: the duplicate an operation names in Remediates-Operation-Id already has its correction.
	CodeAlreadyRemediated Code = "already_remediated"

	// deploys
	CodeMutableReference           Code = "mutable_reference"
	CodeEnvironmentLocked          Code = "environment_locked"
	CodeEnvironmentVersionMismatch Code = "environment_version_mismatch"

	// decisions and corrections that could pay twice
	// CodeCallMayLand: a decision on an operation whose call to the other side may still arrive there.
	CodeCallMayLand Code = "call_may_still_land"
	// CodeResolverElsewhere: a decision on an operation of a service this process does not run.
	CodeResolverElsewhere Code = "resolver_elsewhere"
	// CodeDuplicateRefundNotRefundable: Remediates-Operation-Id names a refund the provider executed twice.
	CodeDuplicateRefundNotRefundable Code = "duplicate_refund_not_refundable"
)

type codeInfo struct {
	status int
	title  string
}

// codes maps every Code to its HTTP status and title. It is the only status table in the code base.
var codes = map[Code]codeInfo{
	CodeInvalidRequest:             {http.StatusBadRequest, "Invalid request"},
	CodeValidationFailed:           {http.StatusUnprocessableEntity, "Validation failed"},
	CodeUnauthorized:               {http.StatusUnauthorized, "Unauthorized"},
	CodeForbidden:                  {http.StatusForbidden, "Forbidden"},
	CodeNotFound:                   {http.StatusNotFound, "Not found"},
	CodeMethodNotAllowed:           {http.StatusMethodNotAllowed, "Method not allowed"},
	CodeBodyTooLarge:               {http.StatusRequestEntityTooLarge, "Request body too large"},
	CodeUnsupportedMediaType:       {http.StatusUnsupportedMediaType, "Unsupported media type"},
	CodeIdempotencyKeyMissing:      {http.StatusBadRequest, "Idempotency-Key header missing"},
	CodeIdempotencyKeyInvalid:      {http.StatusBadRequest, "Idempotency-Key header invalid"},
	CodeIdempotencyKeyReused:       {http.StatusUnprocessableEntity, "Idempotency-Key reused with a different request"},
	CodeRequestInProgress:          {http.StatusConflict, "Request with this Idempotency-Key is still in progress"},
	CodeIdempotencyResponseExpired: {http.StatusConflict, "The stored response of this Idempotency-Key has expired"},
	CodeSupersededOperationUnknown: {http.StatusConflict, "The superseded operation's outcome is unknown"},
	CodeOutcomeUnknown:             {http.StatusServiceUnavailable, "Outcome of this operation is not known yet"},
	CodeStoreUnavailable:           {http.StatusServiceUnavailable, "Store unavailable"},
	CodeRateLimited:                {http.StatusTooManyRequests, "Rate limited"},
	CodeInternal:                   {http.StatusInternalServerError, "Internal error"},

	CodeApprovalRequired: {http.StatusPreconditionRequired, "Approval required"},
	CodeApprovalInvalid:  {http.StatusForbidden, "Approval invalid"},

	CodeOrderHasActiveIntent: {http.StatusConflict, "Order already has an active payment intent"},
	CodeInvalidState:         {http.StatusConflict, "Invalid state for this action"},
	CodeAmountTooLarge:       {http.StatusUnprocessableEntity, "Amount too large"},
	CodeProviderDeclined:     {http.StatusUnprocessableEntity, "Payment provider declined"},
	CodeProviderUnavailable:  {http.StatusBadGateway, "Payment provider unavailable"},
	CodeDuplicateEffect:      {http.StatusConflict, "Duplicate effect confirmed"},
	CodeAlreadyRemediated:    {http.StatusConflict, "Duplicate effect already corrected"},

	CodeMutableReference:           {http.StatusUnprocessableEntity, "Mutable reference"},
	CodeEnvironmentLocked:          {http.StatusConflict, "Environment locked"},
	CodeEnvironmentVersionMismatch: {http.StatusConflict, "Environment version mismatch"},

	CodeCallMayLand:                  {http.StatusConflict, "The operation's call may still arrive"},
	CodeResolverElsewhere:            {http.StatusConflict, "Decided by another service"},
	CodeDuplicateRefundNotRefundable: {http.StatusConflict, "A duplicated refund is not corrected by a refund"},
}

// Status is the HTTP status of a code; unknown codes are 500.
func (c Code) Status() int {
	if info, ok := codes[c]; ok {
		return info.status
	}
	return http.StatusInternalServerError
}

// FieldError names one invalid field of a command.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error is a domain error with a Code. Extensions become extra members of the problem document
// (operation_id, existing_intent_id, holder_deploy_id, ...).
type Error struct {
	Code       Code
	Detail     string
	Fields     []FieldError
	Extensions map[string]any
	// RetryAfter, when positive, is sent as the Retry-After header in seconds.
	RetryAfter int
	// Err is the cause, kept for errors.Is and the log, never shown to the client.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Detail, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Detail)
}

func (e *Error) Unwrap() error { return e.Err }

// Is lets errors.Is(err, problem.ErrNotFound) match any *Error with the same code.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code && t.Detail == "" && t.Err == nil
	}
	return false
}

// New returns an *Error with a formatted detail.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// With adds an extension member and returns e.
func (e *Error) With(name string, value any) *Error {
	if e.Extensions == nil {
		e.Extensions = map[string]any{}
	}
	e.Extensions[name] = value
	return e
}

// Sentinels to wrap or match with errors.Is.
var (
	ErrNotFound         = &Error{Code: CodeNotFound}
	ErrStoreUnavailable = &Error{Code: CodeStoreUnavailable}
)

// StoreUnavailableDetail is the detail of a store_unavailable answer. It speaks of this attempt only: when the
// database is down the server cannot tell whether an earlier attempt with the same key had an effect.
const StoreUnavailableDetail = "the database is unavailable and this attempt changed nothing; retry later with the same Idempotency-Key"

// OutcomeUnknownDetail is the detail of an outcome_unknown answer.
const OutcomeUnknownDetail = "the action may already have taken effect, but its outcome could not be recorded yet; " +
	"retry with the same Idempotency-Key (or ask GET /v1/operations/{operation_id}); never send it with a new key"

// OutcomeUnknown is the 503 outcome_unknown for operation opID, whose effect may have left the process while
// the database that records it is unavailable; cause is kept for the log.
func OutcomeUnknown(opID string, cause error) *Error {
	return &Error{Code: CodeOutcomeUnknown, RetryAfter: 5, Err: cause,
		Extensions: map[string]any{"operation_id": opID, "state": "unknown"}}
}

// NotFound is the 404 for a resource that does not exist in the caller's account.
func NotFound(resource string) *Error {
	return New(CodeNotFound, "%s not found", resource)
}

// Validation is the 422 validation_failed with one entry per invalid field.
func Validation(fields ...FieldError) *Error {
	return &Error{Code: CodeValidationFailed, Detail: "the request has invalid values", Fields: fields}
}

// Document is the RFC 9457 problem document as written on the wire.
type Document map[string]any

// Render turns err into a status and a problem document; unknown errors are 500 with a generic detail.
func Render(err error) (int, Document) {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Code: CodeInternal, Detail: "the server could not finish the request; the error is logged"}
	}
	if e.Code == CodeStoreUnavailable && e.Detail == "" {
		e = &Error{Code: CodeStoreUnavailable, Detail: StoreUnavailableDetail, RetryAfter: 5}
	}
	if e.Code == CodeOutcomeUnknown && e.Detail == "" {
		copied := *e
		copied.Detail = OutcomeUnknownDetail
		e = &copied
	}
	info, ok := codes[e.Code]
	if !ok {
		info = codes[CodeInternal]
	}
	doc := Document{
		"type":   "https://retrysafe.dev/problems/" + string(e.Code),
		"title":  info.title,
		"status": info.status,
		"detail": e.Detail,
		"code":   string(e.Code),
	}
	if e.Detail == "" {
		doc["detail"] = info.title
	}
	if len(e.Fields) > 0 {
		doc["errors"] = e.Fields
	}
	for k, v := range e.Extensions {
		if _, taken := doc[k]; !taken {
			doc[k] = v
		}
	}
	return info.status, doc
}

// Headers are the headers every problem response carries, plus Retry-After when the error asks for it.
func Headers(err error) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	var e *Error
	if errors.As(err, &e) {
		retry := e.RetryAfter
		if (e.Code == CodeStoreUnavailable || e.Code == CodeOutcomeUnknown) && retry == 0 {
			retry = 5
		}
		if retry > 0 {
			h.Set("Retry-After", strconv.Itoa(retry))
		}
	}
	return h
}
