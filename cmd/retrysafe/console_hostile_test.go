package main

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
)

// consoleQuery names every query parameter a console page reads (search, filters, cursors, the notice after a
// decision), so each is sent the hostile value.
var consoleQuery = []string{"q", "kind", "state", "after", "before", "done", "group"}

// TestHostileInputOnEveryConsoleRoute is TestHostileInputOnEveryRoute for the browser console of every service:
// signed in, every GET page with hostile values in its path parameters and in every query parameter. No answer
// is a 5xx, a malformed path parameter is a 404 as in the API, and nothing is logged above INFO: the input never
// reaches SQL, so no ERROR line can carry it.
func TestHostileInputOnEveryConsoleRoute(t *testing.T) {
	t.Parallel()
	e := servicetest.New(t)
	var logs bytes.Buffer
	e.Deps.Logger = slog.New(slog.NewJSONHandler(&syncWriter{w: &logs}, nil))
	cfg, err := loadConfig(env(map[string]string{"DATABASE_URL": e.DB.DSN}))
	if err != nil {
		t.Fatal(err)
	}
	stack, err := httpStack(cfg, e.DB.DB)
	if err != nil {
		t.Fatal(err)
	}
	param := regexp.MustCompile(`[:*][a-z_]+`)
	requests := 0
	for _, b := range builders {
		svc, err := b.build(cfg, e.Deps)
		if err != nil {
			t.Fatalf("build %s: %v", b.name, err)
		}
		handler := service.Handler(e.Deps, stack, svc)
		srv := httptest.NewServer(handler)
		t.Cleanup(srv.Close)
		browser := signedIn(t, srv.URL, servicetest.ApproverSecret)
		for _, r := range handler.Routes() {
			if r.Method != http.MethodGet || !strings.HasPrefix(r.Path, "/console") || strings.Contains(r.Path, "/static/") {
				continue
			}
			for _, v := range hostileValues {
				target := param.ReplaceAllString(r.Path, v)
				urls := []string{target}
				for _, name := range consoleQuery {
					urls = append(urls, target+"?"+name+"="+v)
				}
				for _, u := range urls {
					res, err := browser.Get(srv.URL + u)
					requests++
					if err != nil {
						t.Fatalf("GET %s: %v", u, err)
					}
					body, _ := io.ReadAll(res.Body)
					res.Body.Close()
					short := u
					if len(short) > 120 {
						short = short[:120] + "..."
					}
					if res.StatusCode >= 500 {
						t.Errorf("%s: GET %s -> %d: %.200s", b.name, short, res.StatusCode, problemTitle.Find(body))
					}
					if target != r.Path && !wellFormedID(v) && res.StatusCode != http.StatusNotFound {
						t.Errorf("%s: GET %s -> %d, want 404 for a malformed path parameter", b.name, short, res.StatusCode)
					}
				}
			}
		}
	}
	t.Logf("%d hostile console requests", requests)
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"level":"WARN"`) {
			t.Errorf("hostile console requests logged: %.300s", line)
		}
	}
}

var problemTitle = regexp.MustCompile(`<title>[^<]*</title>`)

// signedIn returns an HTTP client with a console session of secret at base.
func signedIn(t *testing.T, base, secret string) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Jar: jar}
	res, err := c.Get(base + "/console/signin")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	m := regexp.MustCompile(`name="csrf_token" value="([^"]+)"`).FindSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the sign-in page: %s", page)
	}
	res, err = c.PostForm(base+"/console/signin", url.Values{"csrf_token": {string(m[1])}, "key": {secret}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.Request.URL.Path != "/console/approvals" {
		t.Fatalf("sign-in landed on %s (%d)", res.Request.URL, res.StatusCode)
	}
	return c
}
