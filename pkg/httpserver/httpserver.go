// Package httpserver is the HTTP plumbing every retrysafe service shares: a gin engine with JSON access logs,
// panic recovery into problem+json, a request body limit, CheckURL for every path parameter and query value
// before a handler sees it, health endpoints, strict JSON decoding, and a server that caps its connections
// (Limits) and shuts down gracefully when its context ends.
//
//	r := httpserver.NewRouter(httpserver.Options{Logger: logger, DB: db, BodyLimit: 1 << 20})
//	api := r.Group("", auth.Middleware(keys))
//	tickets.Routes(api, svc)
//	err := httpserver.Serve(ctx, ":8081", r, logger, httpserver.Limits{})
package httpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/jsondepth"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Options configures NewRouter.
type Options struct {
	Logger *slog.Logger
	// DB is checked by /readyz; Ready, when set, adds a check (pending migrations).
	DB    *gorm.DB
	Ready func(ctx context.Context) error
	// BodyLimit caps request bodies in bytes (1 MiB when zero).
	BodyLimit int64
	// Middleware runs on every request, routes and health endpoints included, after the access log and
	// outside panic recovery, so a panic is seen as the 500 it becomes (metrics).
	Middleware []gin.HandlerFunc
	// TrustedProxies are the addresses (CIDR prefixes) of the proxies in front of the server: only from them
	// is X-Forwarded-For believed when gin's ClientIP names the client (the throttle of failed sign-ins counts
	// by it). None by default: the client is the connection's peer, and a header anyone can send names nobody.
	TrustedProxies []netip.Prefix
}

// NewRouter returns a gin engine with the shared middleware and /healthz, /readyz.
func NewRouter(o Options) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	limit := o.BodyLimit
	if limit <= 0 {
		limit = 1 << 20
	}
	r := gin.New()
	proxies := make([]string, len(o.TrustedProxies))
	for i, p := range o.TrustedProxies {
		proxies[i] = p.String()
	}
	if err := r.SetTrustedProxies(proxies); err != nil {
		panic(err) // a netip.Prefix always parses: this is a bug
	}
	r.HandleMethodNotAllowed = true
	// An API answers the path it was asked: /v1/tickets/ is no resource, not a redirect to the list.
	r.RedirectTrailingSlash = false
	r.ContextWithFallback = true
	r.Use(noSniff, attempt, accessLog(o.Logger))
	r.Use(o.Middleware...)
	r.Use(recovery(o.Logger), bodyLimit(limit))
	r.NoRoute(func(c *gin.Context) { WriteProblem(c, problem.New("not_found", "no such route")) })
	r.NoMethod(func(c *gin.Context) {
		WriteProblem(c, problem.New("method_not_allowed", "method not allowed on this route"))
	})
	r.GET("/healthz", func(c *gin.Context) { JSON(c, http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", func(c *gin.Context) {
		ctx, cancel := context.WithTimeout(c.Request.Context(), 2*time.Second)
		defer cancel()
		if err := ready(ctx, o); err != nil {
			c.Header("Cache-Control", "no-store")
			JSON(c, http.StatusServiceUnavailable, gin.H{"status": "unavailable", "detail": err.Error()})
			return
		}
		JSON(c, http.StatusOK, gin.H{"status": "ready"})
	})
	return r
}

func ready(ctx context.Context, o Options) error {
	if o.DB != nil {
		sqlDB, err := o.DB.DB()
		if err != nil {
			return err
		}
		if err := sqlDB.PingContext(ctx); err != nil {
			return errors.New("database unreachable")
		}
	}
	if o.Ready != nil {
		return o.Ready(ctx)
	}
	return nil
}

// noSniff tells browsers to take every answer for the type it declares: a JSON answer that quotes a caller's
// text is never rendered as HTML.
func noSniff(c *gin.Context) {
	c.Header("X-Content-Type-Options", "nosniff")
	c.Next()
}

const attemptKey = "retrysafe.attempt"

func attempt(c *gin.Context) {
	id := ids.AttemptIDOf(c.Request.Header)
	c.Set(attemptKey, id)
	c.Header(ids.HeaderAttemptID, id)
	c.Next()
}

// AttemptID is the attempt id of the request ("" outside NewRouter's middleware).
func AttemptID(c *gin.Context) string { return c.GetString(attemptKey) }

// accessLog writes one JSON line per request: never a body, never a header value that could hold a secret.
func accessLog(logger *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		attrs := []any{
			"method", c.Request.Method, "route", c.FullPath(), "status", c.Writer.Status(),
			"duration_ms", time.Since(start).Milliseconds(), "attempt_id", AttemptID(c),
		}
		if p, ok := auth.Lookup(c.Request.Context()); ok {
			attrs = append(attrs, "account_id", p.AccountID)
		}
		if op := c.Writer.Header().Get("Operation-Id"); op != "" {
			attrs = append(attrs, "operation_id", op)
		}
		if c.Writer.Header().Get("Idempotent-Replayed") == "true" {
			attrs = append(attrs, "replayed", true)
		}
		logger.InfoContext(c.Request.Context(), "request", attrs...)
	}
}

func recovery(logger *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				logger.ErrorContext(c.Request.Context(), "panic", "route", c.FullPath(), "panic", fmt.Sprint(v))
				WriteProblem(c, fmt.Errorf("panic: %v", v))
			}
		}()
		c.Next()
	}
}

func bodyLimit(limit int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.Request.ContentLength > limit {
			WriteProblem(c, problem.New("body_too_large", "request body is larger than %d bytes", limit))
			return
		}
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, limit)
		c.Next()
	}
}

// DecodeJSON reads the request body into v strictly (see DecodeJSONBytes): a JSON object, no unknown, duplicate
// or case-folded member names, no trailing data, types as declared: 400 invalid_request otherwise; a number that
// RFC 8785 would write as another (beyond what a double holds exactly) is 422 validation_failed naming it. Both
// before anything is claimed or stored.
func DecodeJSON(c *gin.Context, v any) error {
	if ct := c.GetHeader("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && mt != "application/problem+json") {
			return problem.New("unsupported_media_type", "send Content-Type: application/json")
		}
	}
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return problem.New("body_too_large", "request body is larger than %d bytes", tooLarge.Limit)
		}
		return problem.New("invalid_request", "could not read the request body")
	}
	return DecodeJSONBytes(body, v)
}

// DecodeJSONBytes is DecodeJSON for a body already read, such as the proposed body of an approval request, so
// that it is held to exactly the rules its write will be. Strict means: nested at most jsondepth.Max levels,
// UTF-8, one JSON value, no unknown member, no member twice in one object, no name that matches a field only
// by case, no escape of half a surrogate pair, at any depth; so what is decoded is the only way to read the
// body, and the fingerprint, an approver's summary and the write all see the same request. A body nested
// deeper is refused before it is walked, after one pass over at most its bytes.
func DecodeJSONBytes(body []byte, v any) error {
	if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || trimmed[0] != '{' {
		return problem.New("invalid_request", "the request body must be a JSON object")
	}
	if err := jsondepth.Check(body); err != nil {
		return problem.New("invalid_request", "malformed JSON: %v", err)
	}
	if !utf8.Valid(body) {
		return problem.New("invalid_request", "malformed JSON: the body is not valid UTF-8")
	}
	if err := checkMemberNames(body, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return problem.New("invalid_request", "malformed JSON: %s", describeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return problem.New("invalid_request", "malformed JSON: data after the JSON object")
	}
	return nil
}

// JSON writes v as the JSON answer with status. Every JSON answer of retrysafe, stored, replayed or written
// here, says Content-Type: application/json, without the charset parameter gin's c.JSON adds (JSON is UTF-8;
// RFC 8259 defines no charset), so a client sees one media type for every answer.
func JSON(c *gin.Context, status int, v any) {
	c.Render(status, jsonRender{v})
}

type jsonRender struct{ v any }

func (r jsonRender) Render(w http.ResponseWriter) error {
	r.WriteContentType(w)
	body, err := json.Marshal(r.v)
	if err != nil {
		return err
	}
	_, err = w.Write(body)
	return err
}

func (jsonRender) WriteContentType(w http.ResponseWriter) {
	w.Header()["Content-Type"] = []string{"application/json"}
}

// DecodeActionBody is the one rule for the body of an action endpoint (cancel, capture, rollback, approve,
// deny), whose fields are all optional: an empty body (no bytes, or only white space) means {}; any other body
// is decoded strictly into v as DecodeJSON does, so `{"x":1}` is 400 invalid_request like an unknown field
// anywhere. An action without fields decodes into a struct{}.
func DecodeActionBody(c *gin.Context, v any) error {
	if c.Request.Body == nil || c.Request.Body == http.NoBody {
		return nil
	}
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		return DecodeJSON(c, v) // reports the read error as DecodeJSON does
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	c.Request.Body = io.NopCloser(bytes.NewReader(body))
	return DecodeJSON(c, v)
}

// DecodeActionCommand is DecodeActionBody, then cmd.Validate (defaults apply to an empty body too).
func DecodeActionCommand(c *gin.Context, cmd Command) error {
	if err := DecodeActionBody(c, cmd); err != nil {
		return err
	}
	return cmd.Validate()
}

// Command is a request body that can check itself and apply its defaults.
type Command interface{ Validate() error }

// DecodeCommand decodes the body strictly into cmd, then validates it: both before any idempotency claim, so
// a refused request never burns its key.
func DecodeCommand(c *gin.Context, cmd Command) error {
	if err := DecodeJSON(c, cmd); err != nil {
		return err
	}
	return cmd.Validate()
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field != "" {
			return fmt.Sprintf("field %q must be %s", typeErr.Field, typeErr.Type.String())
		}
		return "the request body must be a JSON object"
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return fmt.Sprintf("syntax error at byte %d", syntaxErr.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of input"
	}
	// json reports unknown fields as `json: unknown field "x"`; that text names the field and nothing private.
	return err.Error()
}

// Serve runs handler on addr, within limits, until ctx ends, then shuts down gracefully within 10 seconds.
func Serve(ctx context.Context, addr string, handler http.Handler, logger *slog.Logger, limits Limits) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	return ServeListener(ctx, ln, handler, logger, limits)
}

// ServeListener is Serve on a listener the caller opened (tests use ":0").
func ServeListener(ctx context.Context, ln net.Listener, handler http.Handler, logger *slog.Logger, limits Limits) error {
	limits = limits.withDefaults()
	srv := newServer(handler, logger, limits)
	limited := limitListener(ln, limits, exemptPeer(limits.TrustedProxies))
	srv.ConnState = limited.connState
	ln = limited
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown %s: %w", ln.Addr(), err)
	}
	return nil
}
