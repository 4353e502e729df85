// Package problem is the one place where retrysafe turns errors into HTTP answers.
//
// Handlers and stores return errors; they never pick a status code. A domain error is a *Error carrying a Code
// of the table below (the code table of docs/contract.md); Write maps it to an RFC 9457
// application/problem+json response. Anything else becomes a generic 500 for the client and a structured log
// line for the operator, except a lost database connection, which becomes 503 store_unavailable (fail closed).
//
// The package speaks net/http and imports no router and no database driver; gin handlers write problems
// through httpserver.WriteProblem.
//
//	if t, err := store.Ticket(ctx, account, id); err != nil {
//		problem.Write(w, r, err) // ErrNotFound wrapped anywhere in err -> 404 not_found
//	}
package problem

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Code is the machine-readable name of a problem, the `code` member of every error response: one of the keys
// of codes, written as its string ("invalid_state"), which is what a client sees and docs/contract.md lists.
// A code missing from the table answers 500 (TestEveryCodeIsInTheTable keeps the code base to the table).
type Code string

type codeInfo struct {
	status int
	title  string
}

// codes maps every Code to its HTTP status and title. It is the only status table in the code base. Add a code
// here, and to docs/contract.md, when a service needs one.
var codes = map[Code]codeInfo{
	"invalid_request":         {http.StatusBadRequest, "Invalid request"},
	"validation_failed":       {http.StatusUnprocessableEntity, "Validation failed"},
	"unauthorized":            {http.StatusUnauthorized, "Unauthorized"},
	"forbidden":               {http.StatusForbidden, "Forbidden"},
	"not_found":               {http.StatusNotFound, "Not found"},
	"method_not_allowed":      {http.StatusMethodNotAllowed, "Method not allowed"},
	"body_too_large":          {http.StatusRequestEntityTooLarge, "Request body too large"},
	"unsupported_media_type":  {http.StatusUnsupportedMediaType, "Unsupported media type"},
	"idempotency_key_missing": {http.StatusBadRequest, "Idempotency-Key header missing"},
	"idempotency_key_invalid": {http.StatusBadRequest, "Idempotency-Key header invalid"},
	"idempotency_key_reused":  {http.StatusUnprocessableEntity, "Idempotency-Key reused with a different request"},
	"request_in_progress":     {http.StatusConflict, "Request with this Idempotency-Key is still in progress"},
	// the key's stored response was pruned after its retention; the key still lives, so the request is not run
	// again: the answer names the operation and its resource.
	"idempotency_response_expired": {http.StatusConflict, "The stored response of this Idempotency-Key has expired"},
	// Supersedes-Operation-Id names an operation whose outcome is unknown.
	"superseded_operation_unknown": {http.StatusConflict, "The superseded operation's outcome is unknown"},
	"outcome_unknown":              {http.StatusServiceUnavailable, "Outcome of this operation is not known yet"},
	"store_unavailable":            {http.StatusServiceUnavailable, "Store unavailable"},
	"rate_limited":                 {http.StatusTooManyRequests, "Rate limited"},
	"internal":                     {http.StatusInternalServerError, "Internal error"},

	"approval_required": {http.StatusPreconditionRequired, "Approval required"},
	"approval_invalid":  {http.StatusForbidden, "Approval invalid"},
	// A Grant-Id that cannot authorize this write: unknown, of another agent or run, of other kinds, revoked,
	// expired or used up (the problem's reason says which).
	"grant_invalid": {http.StatusForbidden, "Grant invalid"},

	// payments
	"order_has_active_intent":    {http.StatusConflict, "Order already has an active payment intent"},
	"invalid_state":              {http.StatusConflict, "Invalid state for this action"},
	"amount_too_large":           {http.StatusUnprocessableEntity, "Amount too large"},
	"provider_declined":          {http.StatusUnprocessableEntity, "Payment provider declined"},
	"provider_unavailable":       {http.StatusBadGateway, "Payment provider unavailable"},
	"duplicate_effect_confirmed": {http.StatusConflict, "Duplicate effect confirmed"},
	// the duplicate an operation names in Remediates-Operation-Id already has its correction.
	"already_remediated": {http.StatusConflict, "Duplicate effect already corrected"},

	// deploys
	"mutable_reference":            {http.StatusUnprocessableEntity, "Mutable reference"},
	"environment_locked":           {http.StatusConflict, "Environment locked"},
	"environment_version_mismatch": {http.StatusConflict, "Environment version mismatch"},

	// decisions and corrections that could pay twice: a decision on an operation whose call to the other side
	// may still arrive there; a decision on an operation of a service this process does not run; a
	// Remediates-Operation-Id that names a refund the provider executed twice.
	"call_may_still_land":             {http.StatusConflict, "The operation's call may still arrive"},
	"resolver_elsewhere":              {http.StatusConflict, "Decided by another service"},
	"duplicate_refund_not_refundable": {http.StatusConflict, "A duplicated refund is not corrected by a refund"},
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
	ErrNotFound         = &Error{Code: "not_found"}
	ErrStoreUnavailable = &Error{Code: "store_unavailable"}
)

// storeUnavailableDetail is the detail of a store_unavailable answer. It speaks of this attempt only: when the
// database is down the server cannot tell whether an earlier attempt with the same key had an effect.
const storeUnavailableDetail = "the database is unavailable and this attempt changed nothing; retry later with the same Idempotency-Key"

// outcomeUnknownDetail is the detail of an outcome_unknown answer.
const outcomeUnknownDetail = "the action may already have taken effect, but its outcome could not be recorded yet; " +
	"retry with the same Idempotency-Key (or ask GET /v1/operations/{operation_id}); never send it with a new key"

// OutcomeUnknown is the 503 outcome_unknown for operation opID, whose effect may have left the process while
// the database that records it is unavailable; cause is kept for the log.
func OutcomeUnknown(opID string, cause error) *Error {
	return &Error{Code: "outcome_unknown", RetryAfter: 5, Err: cause,
		Extensions: map[string]any{"operation_id": opID, "state": "unknown"}}
}

// NotFound is the 404 for a resource that does not exist in the caller's account.
func NotFound(resource string) *Error {
	return New("not_found", "%s not found", resource)
}

// Validation is the 422 validation_failed with one entry per invalid field.
func Validation(fields ...FieldError) *Error {
	return &Error{Code: "validation_failed", Detail: "the request has invalid values", Fields: fields}
}

// Render turns err into a status and an RFC 9457 problem document, as written on the wire; unknown errors are 500 with a generic detail.
func Render(err error) (int, map[string]any) {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Code: "internal", Detail: "the server could not finish the request; the error is logged"}
	}
	if e.Code == "store_unavailable" && e.Detail == "" {
		e = &Error{Code: "store_unavailable", Detail: storeUnavailableDetail, RetryAfter: 5}
	}
	if e.Code == "outcome_unknown" && e.Detail == "" {
		copied := *e
		copied.Detail = outcomeUnknownDetail
		e = &copied
	}
	info, ok := codes[e.Code]
	if !ok {
		info = codes["internal"]
	}
	doc := map[string]any{
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

// headers are the headers every problem response carries, plus Retry-After when the error asks for it.
func headers(err error) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	var e *Error
	if errors.As(err, &e) {
		retry := e.RetryAfter
		if (e.Code == "store_unavailable" || e.Code == "outcome_unknown") && retry == 0 {
			retry = 5
		}
		if retry > 0 {
			h.Set("Retry-After", strconv.Itoa(retry))
		}
	}
	return h
}
