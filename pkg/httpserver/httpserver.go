// Package httpserver holds the gin adapters of retrysafe: the one package (with idem/idemgin beside the package it
// adapts) that puts the net/http pieces on a gin router, and the HTTP plumbing every gin service shares.
//
// Every mechanism (problem, auth, idem, opstatus, approval, httpjson, metrics, ratelimit, tracing) speaks
// context, net/http and its own types and imports no router, so an adopter on plain net/http uses it as it is.
// A gin service reaches it here: WriteProblem writes a problem on a *gin.Context, Wrap mounts net/http
// middleware (auth.Middleware, auth.AgentWrites, ratelimit's Limiter), Mount registers routes given by
// ServeMux pattern (opstatus.Routes, approval's Service.Routes) as gin routes, and Metrics, Tracing and
// Failures label by gin's route template or count by gin's client address. The plumbing: a gin engine with
// JSON access logs, panic recovery into problem+json, a request body limit, CheckURL for every path parameter
// and query value before a handler sees it, health endpoints, and a server that caps its connections (Limits)
// and shuts down gracefully when its context ends.
//
//	r := httpserver.NewRouter(httpserver.Options{Logger: logger, DB: db, BodyLimit: 1 << 20,
//		Middleware: []gin.HandlerFunc{httpserver.Metrics("tickets", m.Request), httpserver.Tracing}})
//	api := r.Group("", httpserver.Wrap(auth.Middleware(keys)))
//	tickets.Routes(api, svc)
//	httpserver.Mount(api, opstatus.Routes(sqlDB))
//	err := httpserver.Serve(ctx, ":8081", r, logger, httpserver.Limits{})
package httpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/retrysafe/retrysafe/pkg/database"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Options configures NewRouter.
type Options struct {
	Logger *slog.Logger
	// DB is checked by /readyz; Ready, when set, adds a check (pending migrations).
	DB    database.Pool
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
		if err := o.DB.PingContext(ctx); err != nil {
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
	c.Request = c.Request.WithContext(ids.WithAttemptID(c.Request.Context(), id))
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
