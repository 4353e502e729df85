package problem

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"

	"github.com/gin-gonic/gin"
)

// Write renders err as problem+json on c and aborts the handler chain. Store failures are translated to
// store_unavailable here as well, so a handler needs no special case for a database that went away; an *Error
// that already names its code (outcome_unknown with a lost connection as its cause) keeps it.
func Write(c *gin.Context, err error) {
	var named *Error
	switch {
	case !errors.As(err, &named) && IsStoreUnavailable(err):
		err = &Error{Code: CodeStoreUnavailable, Err: err}
	case named == nil && IsUnstorableText(err):
		// A last line: input is checked before it reaches SQL, and this is logged as the gap it shows.
		slog.Default().ErrorContext(c.Request.Context(), "text reached the database unchecked",
			"method", c.Request.Method, "route", c.FullPath(), "error", err.Error())
		err = &Error{Code: CodeInvalidRequest, Detail: "the request holds text the server cannot store (NUL or invalid UTF-8)", Err: err}
	}
	if errors.As(err, &named) && named.Code == CodeOutcomeUnknown {
		if id, ok := named.Extensions["operation_id"].(string); ok && c.Writer.Header().Get("Operation-Id") == "" {
			c.Header("Operation-Id", id)
		}
	}
	status, doc := Render(err)
	var e *Error
	if !errors.As(err, &e) || status >= 500 {
		// The default logger: cmd/retrysafe sets it to the process's JSON logger.
		slog.Default().ErrorContext(c.Request.Context(), "request failed",
			"method", c.Request.Method, "route", c.FullPath(), "status", status,
			"operation_id", c.Writer.Header().Get("Operation-Id"), "error", err.Error())
	}
	for k, v := range Headers(err) {
		c.Writer.Header()[k] = v
	}
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false) // a detail may say "<" and mean it; this is JSON, not HTML
	_ = enc.Encode(doc)
	c.Abort()
	c.Data(status, "application/problem+json", bytes.TrimRight(body.Bytes(), "\n"))
}
