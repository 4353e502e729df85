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
// clean text is refused before any page reads it (checkURL).
//
// Its pages are http.Handlers keyed by ServeMux pattern. internal/service mounts them on every gin service
// (httpserver.Mount); a net/http service registers them on its mux:
//
//	routes, err := console.Routes(console.Options{DB: pool, Keys: keys, Service: "notes"})
//	for pattern, h := range routes {
//		mux.Handle(pattern, h)
//	}
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
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/pkg/urlcheck"
)

// Prefix is where the console is served.
const Prefix = "/console"

// IdleTimeout is how long a session lasts without a request.
const IdleTimeout = 12 * time.Hour

// Options configures Routes.
type Options struct {
	// DB is where the console reads and keeps its sessions: a *sql.DB on pgx, or database.PoolOf a gorm pool.
	DB   database.Pool
	Keys *auth.Keys
	// Service names what the console covers in its header and page titles: a service, or every service one
	// process serves ("tickets · payments · deploys"), each operation then labelled with its own.
	Service string
	// Pages are the services' own pages, listed in the navigation after the console's.
	Pages  []Page
	Logger *slog.Logger
	// IdleTimeout ends sessions idle longer (IdleTimeout when zero).
	IdleTimeout time.Duration
	// PageSize is the length of list pages (50 when zero).
	PageSize int
	// Secret signs the sign-in form's CSRF token. Give every replica behind one address the same (cmd/retrysafe
	// derives it from API_KEY_ID_SECRET); when empty, Routes draws one, good for this process only.
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
	Resolve func(r *http.Request, id, key string, d opstatus.Decision) error
}

// DefaultMaxSessionsPerKey is Options.MaxSessionsPerKey when zero.
const DefaultMaxSessionsPerKey = 10

// Page is a page a service adds to its console, at Prefix+Path (a ServeMux path, e.g. "/environments/{name}").
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

// Cell is one table cell; Link, when set, makes it a link (a console path). Mono sets a long value (a digest, an
// artifact reference) in monospace, broken anywhere to fit; ID sets an identifier in monospace on one line, so a
// column of ids reads down, one id a row.
type Cell struct {
	Text, Link string
	Mono, ID   bool
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

// Routes are the console's pages under Prefix, keyed by ServeMux pattern. They authenticate by session
// cookie, not by bearer key. Every answer carries SecurityHeaders; a router that throttles clients before them
// (internal/service: ratelimit.Failures, so refused sign-ins count as unknown API keys do) runs SecurityHeaders
// first, so its refusals carry them too.
func Routes(o Options) (map[string]http.Handler, error) {
	if o.DB == nil || o.Keys == nil {
		return nil, errors.New("console: Options.DB and Options.Keys are required")
	}
	c, err := newConsole(o.withDefaults())
	if err != nil {
		return nil, err
	}
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, err
	}
	css := staticFile(http.FS(static), "console.css")
	in := func(h http.HandlerFunc) http.Handler { return c.session(c.checkURL(h)) }
	form := func(h http.HandlerFunc) http.Handler { return c.session(c.checkURL(c.checkOrigin(c.checkCSRF(h)))) }
	routes := map[string]http.Handler{
		"GET " + Prefix + "/static/console.css":  css,
		"HEAD " + Prefix + "/static/console.css": css,
		"GET " + Prefix + "/signin":              http.HandlerFunc(c.signinPage),
		"POST " + Prefix + "/signin":             c.checkOrigin(c.signin),
		"GET " + Prefix: in(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, Prefix+"/approvals", http.StatusSeeOther)
		}),
		"POST " + Prefix + "/signout":                    form(c.signout),
		"GET " + Prefix + "/approvals":                   in(c.approvals),
		"POST " + Prefix + "/approvals/{id}/{decision}":  form(c.decide),
		"GET " + Prefix + "/operations":                  in(c.operations),
		"GET " + Prefix + "/operations/{id}":             in(c.operation),
		"POST " + Prefix + "/operations/{id}/resolution": form(c.resolve),
	}
	for _, p := range o.Pages {
		routes["GET "+Prefix+p.Path] = in(c.page(p))
	}
	for pattern, h := range routes {
		routes[pattern] = SecurityHeaders(h)
	}
	return routes, nil
}

// withDefaults is o with its zero values given their defaults.
func (o Options) withDefaults() Options {
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
	return o
}

// newConsole parses the pages' templates and lays out the navigation.
func newConsole(o Options) (*console, error) {
	c := &console{o: o, pages: map[string]*template.Template{}, origins: http.NewCrossOriginProtection()}
	for _, name := range []string{"signin", "approvals", "operations", "operation", "view", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		c.pages[name] = t
	}
	c.nav = []navItem{{"Approvals", Prefix + "/approvals"}, {"Operations", Prefix + "/operations"}}
	for _, p := range o.Pages {
		if p.Nav != "" {
			c.nav = append(c.nav, navItem{p.Nav, Prefix + p.Path})
		}
	}
	return c, nil
}

// staticFile serves name of fsys, as http.FileServer serves it at its own path.
func staticFile(fsys http.FileSystem, name string) http.Handler {
	files := http.FileServer(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func(path string) { r.URL.Path = path }(r.URL.Path)
		r.URL.Path = name
		files.ServeHTTP(w, r)
	})
}

// SecurityHeaders keep the pages to themselves: no script at all, styles and forms only from this origin, no
// framing, nothing cached, no referrer carrying an operation id elsewhere.
func SecurityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; "+
			"form-action 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// checkURL holds the console's pages to the API's rule (urlcheck.Request): a path parameter or query value
// that is not clean text is refused before any page reads it, so none reaches SQL; a malformed path parameter
// is the 404 page, a malformed query the 400 page.
func (c *console) checkURL(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := urlcheck.Request(r); err != nil {
			c.fail(w, r, err)
			return
		}
		next(w, r)
	}
}

// render writes page name with data, and the layout's common fields.
func (c *console) render(w http.ResponseWriter, r *http.Request, status int, name string, data map[string]any) {
	data["Service"] = c.o.Service
	data["Nav"] = c.nav
	if s, ok := r.Context().Value(sessionKey{}).(Session); ok {
		data["Session"] = s
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := c.pages[name].Execute(w, data); err != nil {
		c.o.Logger.ErrorContext(r.Context(), "console page not rendered", "page", name, "error", err.Error())
	}
}

// fail renders err as an error page, with the status and code pkg/problem gives it (a 404 for another
// account's thing, as the API answers).
func (c *console) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, doc := problem.Render(err)
	if status >= 500 {
		_, path, _ := strings.Cut(r.Pattern, " ")
		c.o.Logger.ErrorContext(r.Context(), "console request failed", "path", path, "error", err.Error())
	}
	c.render(w, r, status, "error", map[string]any{"Title": doc["title"], "Problem": doc})
}

func (c *console) page(p Page) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := p.Render(Request{
			Context: r.Context(), AccountID: auth.From(r.Context()).AccountID, Param: r.PathValue, Query: r.URL.Query().Get,
		})
		if err != nil {
			c.fail(w, r, err)
			return
		}
		c.render(w, r, http.StatusOK, "view", map[string]any{"Title": v.Title, "View": v})
	}
}
