package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/retrysafe/retrysafe/api"
	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/metrics"
	"github.com/retrysafe/retrysafe/services/provider"
)

// hostileValues are what an attacker puts in a path segment or a query value, percent-encoded as sent: NUL,
// bytes that are not UTF-8, overlong and surrogate encodings, control, bidirectional and zero-width characters,
// a value far longer than any id, path tricks, and ids of the right shape for no resource or the wrong type.
var hostileValues = []string{
	"%00", "tkt_%00", "a%00b", "%ff%fe", "%c0%af", "%ed%a0%80", "%f4%90%80%80",
	"%01%1b%7f", "%c2%85", "%e2%80%ae01", "%e2%81%a6x", "%e2%80%8b", "%ef%bb%bf", "%e2%80%a8",
	strings.Repeat("a", 5000), strings.Repeat("%e6%97%a5", 400), "..", "%2e%2e", "%2F", "%25", "%20",
	"%27%20OR%201=1--", "%5C", "%F0%9F%99%82", "null", "-1", "0",
	"tkt_00000000-0000-7000-8000-000000000000", "op_0193c1c5-0000-7000-8000-00000000000G",
}

// TestHostileInputOnEveryRoute walks every operation of api/openapi.yaml against the services built as serve
// builds them (and the provider sandbox) with hostile values in every path and query parameter: no answer is a
// 5xx, every refusal is a problem document with a code, and every answer is one the spec describes. Nothing is
// written: the database holds no ticket, intent, deploy, approval or operation after the walk.
func TestHostileInputOnEveryRoute(t *testing.T) {
	t.Parallel()
	w := newRouteWalker(t)
	for _, v := range hostileValues {
		w.walk(t, v)
	}
	t.Logf("%d hostile requests over %d operations", w.requests, len(w.keys))
	w.checkNothingWritten(t)
}

// FuzzHostileRoutes is TestHostileInputOnEveryRoute with any bytes, percent-encoded, as the value of every path
// and query parameter. `go test` runs the seeds; `make fuzz` explores.
func FuzzHostileRoutes(f *testing.F) {
	for _, s := range []string{"\x00", "tkt_\x00", "\xff\xfe", "\xc0\xaf", "\xed\xa0\x80", "\u202e", "\u200b", "\ufeff",
		"a\x00b", "\x1b[31m", strings.Repeat("x", 300), "tkt_00000000-0000-7000-8000-000000000000", "/", "..", "?&=#"} {
		f.Add(s)
	}
	w := newRouteWalker(f)
	f.Fuzz(func(t *testing.T, s string) {
		w.walk(t, escapeAll(s))
		w.checkNothingWritten(t)
	})
}

// escapeAll percent-encodes every byte of s but ASCII letters and digits, so any byte sequence reaches the
// server as a path segment or query value.
func escapeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

type walkedServer struct {
	name   string
	client *apitest.Client
}

// routeWalker holds the services, built as serve builds them on one test schema, and the provider sandbox,
// with the server of every operation of the spec.
type routeWalker struct {
	env      *servicetest.Env
	doc      *openapi3.T
	keys     []string // "METHOD /path" of every operation of the spec
	servedBy map[string][]walkedServer
	requests int
	// merchant is payments' own client at the sandbox, to read what reached the provider.
	merchant *provider.Client
}

func newRouteWalker(t testing.TB) *routeWalker {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.Spec)
	if err != nil {
		t.Fatal(err)
	}
	sandbox := httptest.NewServer(provider.NewServer(provider.Config{FaultInjection: true}, nil).Handler())
	t.Cleanup(sandbox.Close)

	e := servicetest.New(t)
	e.Deps.Metrics = metrics.New() // as serve: GET /metrics is served
	cfg, err := loadConfig(env(map[string]string{"DATABASE_URL": e.DB.DSN, "PROVIDER_URL": sandbox.URL}))
	if err != nil {
		t.Fatal(err)
	}
	stack, err := httpStack(cfg, e.DB.DB)
	if err != nil {
		t.Fatal(err)
	}
	w := &routeWalker{env: e, doc: doc, servedBy: map[string][]walkedServer{},
		merchant: provider.NewClient(sandbox.URL, cfg.ProviderSecret, 5*time.Second)}
	var svcs []service.Service
	for _, b := range builders {
		s, err := b.build(cfg, e.Deps)
		if err != nil {
			t.Fatalf("build %s: %v", b.name, err)
		}
		svcs = append(svcs, s)
		c := e.ServeHTTP(t, stack, s)
		for _, r := range service.Handler(e.Deps, stack, s).Routes() {
			key := r.Method + " " + ginParam.ReplaceAllString(r.Path, "{$1}")
			w.servedBy[key] = append(w.servedBy[key], walkedServer{b.name, c})
		}
	}
	e.Idem.Reconcilers = service.Reconcilers(svcs...)
	sandboxClient := apitest.New(t, sandbox.URL, "hostile-merchant-secret")
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			key := method + " " + path
			w.keys = append(w.keys, key)
			if len(w.servedBy[key]) == 0 {
				w.servedBy[key] = []walkedServer{{"provider", sandboxClient}}
			}
		}
	}
	sort.Strings(w.keys)
	return w
}

// walk sends v (percent-encoded as it goes on the wire) as every path and query parameter of every operation,
// as an agent and as an approver.
func (w *routeWalker) walk(t *testing.T, v string) {
	t.Helper()
	for _, key := range w.keys {
		method, path, _ := strings.Cut(key, " ")
		op := w.doc.Paths.Find(path).GetOperation(method)
		target := path
		var query []string
		hasPathParam := false
		for _, p := range op.Parameters {
			switch p.Value.In {
			case openapi3.ParameterInPath:
				hasPathParam = true
				target = strings.ReplaceAll(target, "{"+p.Value.Name+"}", v)
			case openapi3.ParameterInQuery:
				query = append(query, p.Value.Name+"="+v)
			}
		}
		if len(query) == 0 {
			query = []string{"x=" + v} // a parameter the route does not take is still checked
		}
		target += "?" + strings.Join(query, "&")
		var body any
		if method == http.MethodPost || method == http.MethodPut {
			body = "{}"
		}
		for _, srv := range w.servedBy[key] {
			for _, secret := range []string{servicetest.AgentSecret, servicetest.ApproverSecret} {
				c := srv.client.For(t)
				if srv.name != "provider" {
					c = c.As(secret)
				}
				res, err := c.Try(method, target, body, apitest.Key("hostile-"+srv.name), apitest.Header("Approval-Id", "apv_"+v))
				w.requests++
				if err != nil {
					t.Errorf("%s %s: %v", method, target, err)
					continue
				}
				checkNotServerError(t, srv.name, method, target, res)
				// A read of a malformed id is 404, never 400 or 422. (A well-formed one is looked for, after its
				// query is checked.)
				if method == http.MethodGet && hasPathParam && srv.name != "provider" && !wellFormedID(v) && res.Code != http.StatusNotFound {
					t.Errorf("%s: GET %.120s -> %d, want 404: %s", srv.name, target, res.Code, res.Body)
				}
			}
		}
	}
}

// wellFormedID reports whether the percent-encoded v decodes to an id ids.New could have made.
func wellFormedID(v string) bool {
	decoded, err := url.PathUnescape(v)
	if err != nil {
		return false
	}
	for _, prefix := range []string{"tkt_", "cmt_", "pi_", "re_", "dep_", "op_", "apv_"} {
		if ids.Valid(prefix, decoded) {
			return true
		}
	}
	return false
}

func (w *routeWalker) checkNothingWritten(t *testing.T) {
	t.Helper()
	counters, err := w.merchant.Counters(t.Context())
	if err != nil {
		t.Fatalf("provider counters: %v", err)
	}
	for kind, n := range counters {
		if n != 0 {
			t.Errorf("%d %s calls reached the provider from hostile requests", n, kind)
		}
	}
	for _, table := range []string{"tickets", "ticket_comments", "ticket_status_changes", "payment_intents", "payment_refunds", "deploys", "approvals", "operations"} {
		var n int64
		if err := w.env.DB.DB.Table(table).Count(&n).Error; err != nil {
			t.Fatalf("count %s: %v", table, err)
		}
		if n != 0 {
			t.Errorf("%d rows in %s after hostile requests", n, table)
		}
	}
}

func checkNotServerError(t *testing.T, name, method, target string, res *apitest.Response) {
	t.Helper()
	short := target
	if len(short) > 120 {
		short = short[:120] + "..."
	}
	if res.Code >= 500 {
		t.Errorf("%s: %s %s -> %d: %s", name, method, short, res.Code, res.Body)
		return
	}
	if res.Code < 400 || name == "provider" {
		return
	}
	var p struct {
		Code string `json:"code"`
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" || json.Unmarshal(res.Body, &p) != nil || p.Code == "" {
		t.Errorf("%s: %s %s -> %d is not a problem with a code (%s): %s", name, method, short, res.Code, ct, res.Body)
	}
}

// TestActionBodiesFollowOneRule: every action endpoint (capture, cancel, rollback, approve, deny) takes an
// empty body or {} as {}, and refuses any other body that is not an object of its declared fields with 400
// invalid_request, on every service; nothing is written either way (the ids name nothing).
func TestActionBodiesFollowOneRule(t *testing.T) {
	t.Parallel()
	w := newRouteWalker(t)
	missing := "00000000-0000-7000-8000-000000000000"
	actions := map[string]string{
		"POST /v1/payment_intents/{id}/capture": "/v1/payment_intents/pi_" + missing + "/capture",
		"POST /v1/payment_intents/{id}/cancel":  "/v1/payment_intents/pi_" + missing + "/cancel",
		"POST /v1/deploys/{id}/cancel":          "/v1/deploys/dep_" + missing + "/cancel",
		"POST /v1/deploys/{id}/rollback":        "/v1/deploys/dep_" + missing + "/rollback",
		"POST /v1/approvals/{id}/approve":       "/v1/approvals/apv_" + missing + "/approve",
		"POST /v1/approvals/{id}/deny":          "/v1/approvals/apv_" + missing + "/deny",
	}
	for key, path := range actions {
		if len(w.servedBy[key]) == 0 || w.servedBy[key][0].name == "provider" {
			t.Fatalf("no service serves %s", key)
		}
		for _, srv := range w.servedBy[key] {
			// Approvals are decided with an approver key; every other action is an agent key's to send.
			secret := servicetest.AgentSecret
			if strings.HasPrefix(key, "POST /v1/approvals/") {
				secret = servicetest.ApproverSecret
			}
			c := srv.client.For(t).As(secret)
			for _, body := range []any{nil, "", " \n", "{}"} {
				res := c.Post(path, body, apitest.Key("action-body"))
				if res.Code != http.StatusNotFound {
					t.Errorf("%s %s with body %q: %d %s, want 404 (the body is {})", srv.name, key, body, res.Code, res.Body)
				}
			}
			for _, body := range []string{`{"x":1}`, `[]`, `null`, `"x"`, `{} {}`, `{"expected_environment_version":1,"expected_environment_version":2}`} {
				res := c.Post(path, body, apitest.Key("action-body"))
				if res.Code != http.StatusBadRequest || res.Str(t, "code") != "invalid_request" {
					t.Errorf("%s %s with body %s: %d %s, want 400 invalid_request", srv.name, key, body, res.Code, res.Body)
				}
			}
		}
	}
	w.checkNothingWritten(t)
}
