package console_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/auth"
)

// The browser tests of the console are in internal/consoletest; these check sessions over plain HTTP.

type person struct {
	t    testing.TB
	base string
	http *http.Client
}

func newPerson(t testing.TB, base string) *person {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &person{t: t, base: base, http: &http.Client{Jar: jar}}
}

func (p *person) do(method, path string, form url.Values) (*http.Response, string) {
	p.t.Helper()
	req, err := http.NewRequest(method, p.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		p.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	res, err := p.http.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		p.t.Fatal(err)
	}
	return res, string(body)
}

var csrfInput = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

func csrf(t testing.TB, page string) string {
	t.Helper()
	m := csrfInput.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in %s", page)
	}
	return m[1]
}

// signIn signs in and returns the page it lands on.
func (p *person) signIn(secret string) (*http.Response, string) {
	p.t.Helper()
	_, form := p.do(http.MethodGet, "/console/signin", nil)
	return p.do(http.MethodPost, "/console/signin", url.Values{"csrf_token": {csrf(p.t, form)}, "key": {secret}})
}

func setup(t *testing.T) (*servicetest.Env, string) {
	t.Helper()
	env := servicetest.New(t)
	env.Serve(t, servicetest.Routes(func(gin.IRouter) {}))
	return env, env.URL
}

func sessions(t *testing.T, env *servicetest.Env) int64 {
	t.Helper()
	var n int64
	if err := env.DB.Raw(`SELECT count(*) FROM console_sessions`).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSignInAndOut(t *testing.T) {
	t.Parallel()
	env, base := setup(t)
	p := newPerson(t, base)

	// Without a session every page sends the browser to sign in; the sign-in page forbids script.
	res, _ := p.do(http.MethodGet, "/console/operations", nil)
	if res.Request.URL.Path != "/console/signin" {
		t.Fatalf("unsigned GET landed on %s", res.Request.URL)
	}
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "script-src 'none'") {
		t.Fatalf("Content-Security-Policy %q", csp)
	}

	// A sign-in without the form's token, or with an unknown key, opens nothing.
	if res, _ := p.do(http.MethodPost, "/console/signin", url.Values{"key": {servicetest.ApproverSecret}}); res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-in without CSRF token = %d", res.StatusCode)
	}
	if res, page := p.signIn("not-a-key"); res.StatusCode != http.StatusUnauthorized || !strings.Contains(page, "not known") {
		t.Fatalf("unknown key = %d", res.StatusCode)
	}
	if n := sessions(t, env); n != 0 {
		t.Fatalf("%d sessions after refused sign-ins", n)
	}

	// The key goes in the form body only; the session cookie is opaque, HttpOnly and SameSite=Strict.
	jarless := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Jar: p.http.Jar}
	_, form := p.do(http.MethodGet, "/console/signin", nil)
	req, _ := http.NewRequest(http.MethodPost, base+"/console/signin",
		strings.NewReader(url.Values{"csrf_token": {csrf(t, form)}, "key": {servicetest.ApproverSecret}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	signed, err := jarless.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	signed.Body.Close()
	var cookie string
	for _, c := range signed.Header.Values("Set-Cookie") {
		if strings.HasPrefix(c, "retrysafe_console=") {
			cookie = c
		}
	}
	if signed.StatusCode != http.StatusSeeOther || !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") ||
		strings.Contains(cookie, servicetest.ApproverSecret) || strings.Contains(signed.Header.Get("Location"), "key") {
		t.Fatalf("sign-in answer %d, Set-Cookie %q, Location %q", signed.StatusCode, cookie, signed.Header.Get("Location"))
	}
	res, page := p.do(http.MethodGet, "/console/approvals", nil)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, "acct_demo") || strings.Contains(page, servicetest.ApproverSecret) {
		t.Fatalf("inbox after sign-in = %d", res.StatusCode)
	}
	var stored string
	env.DB.Raw(`SELECT id_hash FROM console_sessions`).Scan(&stored)
	if stored == "" || strings.Contains(cookie, stored) {
		t.Fatal("the session table keeps the cookie's value instead of its hash")
	}

	// Sign out needs the token, then ends the session: the old cookie no longer opens anything.
	if res, _ := p.do(http.MethodPost, "/console/signout", url.Values{}); res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign out without CSRF token = %d", res.StatusCode)
	}
	res, _ = p.do(http.MethodPost, "/console/signout", url.Values{"csrf_token": {csrf(t, page)}})
	if res.Request.URL.Path != "/console/signin" || sessions(t, env) != 0 {
		t.Fatalf("sign out landed on %s with %d sessions", res.Request.URL, sessions(t, env))
	}
}

func TestSessionsEnd(t *testing.T) {
	t.Parallel()
	env, base := setup(t)
	p := newPerson(t, base)
	p.signIn(servicetest.AgentSecret)
	if res, _ := p.do(http.MethodGet, "/console/operations", nil); res.Request.URL.Path != "/console/operations" {
		t.Fatalf("signed in, landed on %s", res.Request.URL)
	}
	// 12 hours idle end a session.
	if err := env.DB.Exec(`UPDATE console_sessions SET last_seen_at = now() - interval '12 hours 1 minute'`).Error; err != nil {
		t.Fatal(err)
	}
	if res, _ := p.do(http.MethodGet, "/console/operations", nil); res.Request.URL.Path != "/console/signin" {
		t.Fatalf("after 12 h idle, landed on %s", res.Request.URL)
	}
	// A request keeps a session alive: 11 hours idle, then a request, then 11 more.
	p.signIn(servicetest.AgentSecret)
	env.DB.Exec(`UPDATE console_sessions SET last_seen_at = now() - interval '11 hours'`)
	p.do(http.MethodGet, "/console/operations", nil)
	var idle float64
	env.DB.Raw(`SELECT extract(epoch FROM max(now() - last_seen_at)) FROM console_sessions WHERE last_seen_at > now() - interval '12 hours'`).Scan(&idle)
	if idle > 60 {
		t.Fatalf("a request left the session %v s idle", idle)
	}

	// A key removed from API_KEYS ends its sessions.
	agentKey, _ := env.Keys.Authenticate(servicetest.AgentSecret)
	*env.Keys = *env.Keys.Without(func(p auth.Principal) bool { return p == agentKey })
	if res, _ := p.do(http.MethodGet, "/console/operations", nil); res.Request.URL.Path != "/console/signin" {
		t.Fatalf("with the agent key removed, landed on %s", res.Request.URL)
	}
}
