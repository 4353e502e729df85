package problem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
)

// Write renders err as problem+json on w: the one place an error becomes an HTTP answer. Store failures are
// translated to store_unavailable here, so a handler needs no special case for a database that went away; an
// *Error that already names its code (outcome_unknown with a lost connection as its cause) keeps it. A request
// whose caller hung up is answered the same way (nothing of it was done, or the error would name the operation),
// and logged as the caller's doing, not as a server error. The log line names the route by r.Pattern (a router
// that is not a ServeMux sets it to its own route template).
func Write(w http.ResponseWriter, r *http.Request, err error) {
	_, route, found := strings.Cut(r.Pattern, " ")
	if !found {
		route = r.Pattern
	}
	ctx := r.Context()
	hungUp := ctx.Err() != nil && errors.Is(err, context.Canceled)
	err = classify(r, route, err, hungUp)
	var named *Error
	if errors.As(err, &named) && named.Code == "outcome_unknown" {
		if id, ok := named.Extensions["operation_id"].(string); ok && w.Header().Get("Operation-Id") == "" {
			w.Header().Set("Operation-Id", id)
		}
	}
	status, doc := Render(err)
	var e *Error
	switch {
	case hungUp:
		slog.Default().InfoContext(ctx, "caller hung up before the answer",
			"method", r.Method, "route", route, "status", status, "operation_id", w.Header().Get("Operation-Id"))
	case !errors.As(err, &e) || status >= 500:
		// The default logger: cmd/retrysafe sets it to the process's JSON logger.
		slog.Default().ErrorContext(ctx, "request failed",
			"method", r.Method, "route", route, "status", status,
			"operation_id", w.Header().Get("Operation-Id"), "error", err.Error())
	}
	for k, v := range headers(err) {
		w.Header()[k] = v
	}
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false) // a detail may say "<" and mean it; this is JSON, not HTML
	_ = enc.Encode(doc)
	w.WriteHeader(status)
	_, _ = w.Write(bytes.TrimRight(body.Bytes(), "\n"))
}

// classify names the problem of an error that names none: a store failure or a caller's hang-up is
// store_unavailable, text the database refused is invalid_request (and logged as the gap it shows).
func classify(r *http.Request, route string, err error, hungUp bool) error {
	var named *Error
	switch {
	case !errors.As(err, &named) && (hungUp || IsStoreUnavailable(err)):
		return &Error{Code: "store_unavailable", Err: err}
	case named == nil && isUnstorableText(err):
		// A last line: input is checked before it reaches SQL, and this is logged as the gap it shows.
		slog.Default().ErrorContext(r.Context(), "text reached the database unchecked",
			"method", r.Method, "route", route, "error", err.Error())
		return &Error{Code: "invalid_request", Detail: "the request holds text the server cannot store (NUL or invalid UTF-8)", Err: err}
	}
	return err
}
