// Package console is the browser console of a retrysafe service, for the people in the loop: an approvals
// inbox, the operations of the account with each one's timeline and audit check, and pages the service adds
// (the deploys service's environments). It is server-rendered with html/template and the package's own CSS,
// runs no script and loads nothing from elsewhere, so it works offline.
//
// A person signs in with an API key typed in a form; the console keeps an opaque session id in an HttpOnly,
// SameSite=Strict cookie (Secure under TLS, or always with Options.SecureCookie) and the session in PostgreSQL
// (console_sessions), ended by sign out, after 12 hours idle, or when the key opens more than
// Options.MaxSessionsPerKey. Every POST must come from the console's own origin and carry a CSRF token: the
// session's, or for the sign-in a token the server signed. Every page is scoped to the session's account:
// another account's approval or operation is a 404, as in the API, and a path or query value that is not
// clean text is refused before any page reads it (httpserver.URLError).
//
// pkg/service mounts it on every service:
//
//	console.Mount(engine, console.Options{DB: db, Keys: keys, Service: "deploys", Pages: svc.ConsolePages()})
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Prefix is where the console is served.
const Prefix = "/console"

// IdleTimeout is how long a session lasts without a request.
const IdleTimeout = 12 * time.Hour

// Options configures Mount.
type Options struct {
	DB   *gorm.DB
	Keys *auth.Keys
	// Service names the service in page titles.
	Service string
	// Pages are the service's own pages, listed in the navigation after the console's.
	Pages  []Page
	Logger *slog.Logger
	// IdleTimeout ends sessions idle longer (IdleTimeout when zero).
	IdleTimeout time.Duration
	// PageSize is the length of list pages (50 when zero).
	PageSize int
	// Secret signs the sign-in form's CSRF token. Give every replica behind one address the same (cmd/retrysafe
	// derives it from API_KEY_ID_SECRET); when empty, Mount draws one, good for this process only.
	Secret []byte
	// SecureCookie marks the cookies Secure on every request, for a console served over HTTPS by a proxy in
	// front (the request the server sees is then plain HTTP). Under TLS of its own they are Secure anyway.
	SecureCookie bool
	// MaxSessionsPerKey bounds the sessions one API key holds (DefaultMaxSessionsPerKey when zero): a new
	// sign-in ends the least recently used beyond it.
	MaxSessionsPerKey int
	// Resolve, when set, records a person's decision on an unknown operation from its page, under
	// Idempotency-Key key, as POST /v1/operations/{id}/resolution does (resolution.Decider.DecideForm); the
	// page offers the form to approver keys only. It returns the problem that refused the decision.
	Resolve func(ctx *gin.Context, id, key string, d opstatus.Decision) error
	// Throttle, when set, runs before every console route: the process's ratelimit.Failures, so refused
	// sign-ins count against the client as unknown API keys do.
	Throttle gin.HandlerFunc
}

// DefaultMaxSessionsPerKey is Options.MaxSessionsPerKey when zero.
const DefaultMaxSessionsPerKey = 10

// Page is a page a service adds to its console, at Prefix+Path (a gin template, e.g. "/environments/:name").
// Render builds it for the signed-in account; the console escapes everything in the View. Render returns
// problem errors (problem.NotFound for another account's thing) like a handler.
type Page struct {
	Path string
	// Nav, when set, lists the page in the navigation under that label.
	Nav    string
	Render func(r Request) (View, error)
}

// Request is what a Page's Render may read: the context, the signed-in account and the request's parameters.
type Request struct {
	Context   context.Context
	AccountID string
	Param     func(name string) string
	Query     func(name string) string
}

// View is a page as data: a title and sections, each a list of fields and/or a table.
type View struct {
	Title    string
	Sections []Section
}

// Section is one part of a View.
type Section struct {
	Title  string
	Fields []Field
	Table  *Table
	// Empty is shown when the section has neither fields nor rows.
	Empty string
}

// Field is a labelled value; Link, when set, makes the value a link (a console path).
type Field struct {
	Label, Value, Link string
}

// Table is a table of cells.
type Table struct {
	Columns []string
	Rows    [][]Cell
	// Next, when set, links to the next page of the table.
	Next string
}

// Cell is one table cell; Link, when set, makes it a link (a console path). Mono sets an identifier or a
// digest in monospace, broken anywhere to fit.
type Cell struct {
	Text, Link string
	Mono       bool
}

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

type console struct {
	o       Options
	pages   map[string]*template.Template
	nav     []navItem
	origins *http.CrossOriginProtection
}

type navItem struct{ Label, Link string }

// Mount serves the console under Prefix on r. The routes authenticate by session cookie, not by bearer key.
func Mount(r gin.IRouter, o Options) error {
	if o.DB == nil || o.Keys == nil {
		return errors.New("console: Options.DB and Options.Keys are required")
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = IdleTimeout
	}
	if o.PageSize <= 0 {
		o.PageSize = 50
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxSessionsPerKey <= 0 {
		o.MaxSessionsPerKey = DefaultMaxSessionsPerKey
	}
	if len(o.Secret) == 0 {
		o.Secret = make([]byte, 32)
		_, _ = rand.Read(o.Secret) // crypto/rand.Read never fails (Go 1.24+)
	}
	c := &console{o: o, pages: map[string]*template.Template{}, origins: http.NewCrossOriginProtection()}
	for _, name := range []string{"signin", "approvals", "operations", "operation", "view", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return err
		}
		c.pages[name] = t
	}
	c.nav = []navItem{{"Approvals", Prefix + "/approvals"}, {"Operations", Prefix + "/operations"}}
	for _, p := range o.Pages {
		if p.Nav != "" {
			c.nav = append(c.nav, navItem{p.Nav, Prefix + p.Path})
		}
	}
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return err
	}

	g := r.Group(Prefix, securityHeaders)
	if o.Throttle != nil {
		g.Use(o.Throttle)
	}
	g.StaticFileFS("/static/console.css", "console.css", http.FS(static))
	g.GET("/signin", c.signinPage)
	g.POST("/signin", c.checkOrigin, c.signin)
	in := g.Group("", c.session, c.checkURL)
	in.GET("", func(ctx *gin.Context) { ctx.Redirect(http.StatusSeeOther, Prefix+"/approvals") })
	in.POST("/signout", c.checkOrigin, c.checkCSRF, c.signout)
	in.GET("/approvals", c.approvals)
	in.POST("/approvals/:id/:decision", c.checkOrigin, c.checkCSRF, c.decide)
	in.GET("/operations", c.operations)
	in.GET("/operations/:id", c.operation)
	in.POST("/operations/:id/resolution", c.checkOrigin, c.checkCSRF, c.resolve)
	for _, p := range o.Pages {
		in.GET(p.Path, c.page(p))
	}
	return nil
}

// securityHeaders keep the pages to themselves: no script at all, styles and forms only from this origin, no
// framing, nothing cached, no referrer carrying an operation id elsewhere.
func securityHeaders(c *gin.Context) {
	h := c.Writer.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; "+
		"form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	c.Next()
}

// checkURL holds the console's pages to the API's rule (httpserver.URLError): a path parameter or query value
// that is not clean text is refused before any page reads it, so none reaches SQL; a malformed path parameter
// is the 404 page, a malformed query the 400 page.
func (c *console) checkURL(ctx *gin.Context) {
	if err := httpserver.URLError(ctx); err != nil {
		c.fail(ctx, err)
		return
	}
	ctx.Next()
}

// render writes page name with data, and the layout's common fields.
func (c *console) render(ctx *gin.Context, status int, name string, data map[string]any) {
	data["Service"] = c.o.Service
	data["Nav"] = c.nav
	if s, ok := ctx.Get(sessionKey); ok {
		data["Session"] = s
	}
	ctx.Status(status)
	ctx.Header("Content-Type", "text/html; charset=utf-8")
	if err := c.pages[name].Execute(ctx.Writer, data); err != nil {
		c.o.Logger.ErrorContext(ctx, "console page not rendered", "page", name, "error", err.Error())
	}
}

// fail renders err as an error page, with the status and code pkg/problem gives it (a 404 for another
// account's thing, as the API answers).
func (c *console) fail(ctx *gin.Context, err error) {
	status, doc := problem.Render(err)
	if status >= 500 {
		c.o.Logger.ErrorContext(ctx, "console request failed", "path", ctx.FullPath(), "error", err.Error())
	}
	c.render(ctx, status, "error", map[string]any{"Title": doc["title"], "Problem": doc})
	ctx.Abort()
}

func (c *console) page(p Page) gin.HandlerFunc {
	return func(ctx *gin.Context) {
		v, err := p.Render(Request{
			Context: ctx.Request.Context(), AccountID: auth.From(ctx.Request.Context()).AccountID, Param: ctx.Param, Query: ctx.Query,
		})
		if err != nil {
			c.fail(ctx, err)
			return
		}
		c.render(ctx, http.StatusOK, "view", map[string]any{"Title": v.Title, "View": v})
	}
}
