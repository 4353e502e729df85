package console_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/console"
)

// serveConsole serves the console of a service of no routes with the console settings o.
func serveConsole(t *testing.T, o console.Options) (*servicetest.Env, string) {
	t.Helper()
	env := servicetest.New(t)
	env.ServeHTTP(t, service.HTTP{Console: o}, servicetest.Routes(func(gin.IRouter) {}))
	return env, env.URL
}

// postSignin posts the sign-in form with the given signin cookie and form token and extra headers, without
// following the redirect, and returns the answer's status.
func postSignin(t *testing.T, base, cookie, token, secret string, header ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/console/signin",
		strings.NewReader(url.Values{"csrf_token": {token}, "key": {secret}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: "retrysafe_console_signin", Value: cookie})
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestSigninFormMustComeFromTheConsole: the sign-in's cookie and token must be a pair the server issued, from
// the console's own origin. An attacker who plants a cookie of its choosing and posts the matching token (to
// sign the victim's browser into the attacker's account), or posts from another site, opens no session.
func TestSigninFormMustComeFromTheConsole(t *testing.T) {
	t.Parallel()
	env, base := serveConsole(t, console.Options{})
	if code := postSignin(t, base, "attacker-chosen", "attacker-chosen", servicetest.AgentSecret); code != http.StatusForbidden {
		t.Errorf("an attacker-chosen cookie and token pair: %d", code)
	}
	_, form := newPerson(t, base).do(http.MethodGet, "/console/signin", nil)
	issued := csrf(t, form)
	for _, h := range [][]string{
		{"Origin", "https://evil.example"},
		{"Sec-Fetch-Site", "cross-site"},
	} {
		if code := postSignin(t, base, issued, issued, servicetest.AgentSecret, h...); code != http.StatusForbidden {
			t.Errorf("an issued pair posted with %s: %s: %d", h[0], h[1], code)
		}
	}
	if n := sessions(t, env); n != 0 {
		t.Fatalf("%d sessions opened by forged sign-ins", n)
	}
	if code := postSignin(t, base, issued, issued, servicetest.AgentSecret, "Sec-Fetch-Site", "same-origin"); code != http.StatusSeeOther {
		t.Fatalf("the issued pair from the console: %d", code)
	}
	if n := sessions(t, env); n != 1 {
		t.Fatalf("%d sessions after one sign-in", n)
	}
}

// TestSessionsPerKeyAreBounded: a key holds at most MaxSessionsPerKey sessions; a new sign-in ends the least
// recently used, and another key's sessions are not touched.
func TestSessionsPerKeyAreBounded(t *testing.T) {
	t.Parallel()
	env, base := serveConsole(t, console.Options{MaxSessionsPerKey: 3})
	approver := newPerson(t, base)
	approver.signIn(servicetest.ApproverSecret)
	var people []*person
	for range 5 {
		p := newPerson(t, base)
		if res, _ := p.signIn(servicetest.AgentSecret); res.Request.URL.Path != "/console/approvals" {
			t.Fatalf("sign-in landed on %s", res.Request.URL)
		}
		people = append(people, p)
	}
	var n int64
	env.DB.Raw(`SELECT count(*) FROM console_sessions WHERE role = 'agent'`).Scan(&n)
	if n != 3 {
		t.Fatalf("the agent key holds %d sessions; want 3", n)
	}
	for i, p := range people {
		res, _ := p.do(http.MethodGet, "/console/operations", nil)
		if signedIn := res.Request.URL.Path == "/console/operations"; signedIn != (i >= 2) {
			t.Errorf("sign-in %d of 5: still signed in %v", i+1, signedIn)
		}
	}
	if res, _ := approver.do(http.MethodGet, "/console/operations", nil); res.Request.URL.Path != "/console/operations" {
		t.Error("another key's session was ended")
	}
}

// TestSecureCookieBehindAProxy: with SecureCookie (a TLS proxy in front, plain HTTP behind it) every cookie of
// the console is Secure; without it, on plain HTTP, none is.
func TestSecureCookieBehindAProxy(t *testing.T) {
	t.Parallel()
	for _, secure := range []bool{true, false} {
		_, base := serveConsole(t, console.Options{SecureCookie: secure})
		res, err := http.Get(base + "/console/signin")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		cookies := res.Header.Values("Set-Cookie")
		if len(cookies) == 0 {
			t.Fatal("no cookie set by the sign-in page")
		}
		for _, c := range cookies {
			if strings.Contains(c, "; Secure") != secure {
				t.Errorf("SecureCookie %v: Set-Cookie %q", secure, c)
			}
		}
	}
}

var approvalCard = regexp.MustCompile(`<article class="card approval" id="(apv_[^"]+)"`)

// TestLookAlikeRequestsDoNotBuryTheRealOne: one key asks for a deploy; another then sends 55 requests that look
// like it, 30 the same to the byte and 25 differing by their artifact. The inbox's first page still shows the
// real request, and marks the look-alikes: the flood takes one group with a link to all of it, and each
// request that reads the same as others says how many.
func TestLookAlikeRequestsDoNotBuryTheRealOne(t *testing.T) {
	t.Parallel()
	env, base := serveConsole(t, console.Options{})
	err := env.DB.Exec(`
INSERT INTO approvals (id, account_id, method, path, route, idempotency_key, fingerprint, summary, state, requested_by,
                       expires_at, created_at, body)
SELECT id, 'acct_demo', 'POST', '/v1/deploys', '/v1/deploys', key, 'fp-' || key,
       jsonb_build_object('action', 'deploy', 'service', 'api', 'environment', 'production', 'artifact', artifact),
       'pending', requested_by, now() + interval '1 hour', now() - make_interval(secs => 100 - i), '{}'
FROM (SELECT 0 AS i, 'apv_real' AS id, 'real' AS key, 'agent:realkey' AS requested_by, 'sha-1' AS artifact
      UNION ALL
      SELECT i, 'apv_flood_' || i, 'flood-' || i, 'agent:floodkey', CASE WHEN i <= 30 THEN 'sha-1' ELSE 'sha-' || i END
      FROM generate_series(1, 55) AS i) AS r`).Error
	if err != nil {
		t.Fatal(err)
	}
	p := newPerson(t, base)
	p.signIn(servicetest.ApproverSecret)
	res, page := p.do(http.MethodGet, "/console/approvals", nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("inbox: %d", res.StatusCode)
	}
	shown := approvalCard.FindAllStringSubmatch(page, -1)
	ids := make([]string, len(shown))
	for i, m := range shown {
		ids[i] = m[1]
	}
	if !slices.Contains(ids, "apv_real") {
		t.Fatalf("the real request is not on the first page; it shows %v", ids)
	}
	if len(ids) > 6 {
		t.Errorf("the flood takes %d cards of the first page: %v", len(ids), ids)
	}
	for _, want := range []string{
		"55 requests of <code>agent:floodkey</code> for <code>POST /v1/deploys</code>",
		`id="alike-apv_real">31 pending requests`,
		"All 55 requests of this key for this route",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the inbox lacks %q", want)
		}
	}
	all := regexp.MustCompile(`href="(/console/approvals\?group=[0-9a-f]{64})" class="all"`).FindStringSubmatch(page)
	if all == nil {
		t.Fatal("no link to the whole group")
	}
	count := 0
	next := all[1]
	for next != "" && count < 100 {
		res, group := p.do(http.MethodGet, next, nil)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", next, res.StatusCode)
		}
		for _, m := range approvalCard.FindAllStringSubmatch(group, -1) {
			if !strings.HasPrefix(m[1], "apv_flood_") {
				t.Errorf("the flood's group lists %s", m[1])
			}
			count++
		}
		next = ""
		if m := regexp.MustCompile(`href="([^"]+)" id="next"`).FindStringSubmatch(group); m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if count != 55 {
		t.Errorf("the group's pages list %d requests; want 55", count)
	}
}

// TestPostWithoutSessionIsNotRead: a POST without a session that announces a large body and sends 4 bytes is
// refused at once, closing the connection, as the API refuses a request without a key: the client holds
// nothing by sending the rest slowly.
func TestPostWithoutSessionIsNotRead(t *testing.T) {
	t.Parallel()
	_, base := serveConsole(t, console.Options{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(15 * time.Second)) // a watchdog: a server that drains the body never answers
	fmt.Fprint(conn, "POST /console/approvals/apv_x/approve HTTP/1.1\r\nHost: x\r\n"+
		"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\ncsrf")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer before the body was sent: %v", err)
	}
	io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized || !res.Close {
		t.Fatalf("%d, close %v; want 401 and Connection: close", res.StatusCode, res.Close)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the server sent more after its 401")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the server kept the connection open after its 401")
	}
}
