package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
)

var pathParam = regexp.MustCompile(`\{[a-z_]+\}`)

func TestConfigLimits(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP.MaxConns != 1024 || cfg.HTTP.MaxConnsPerClient != 64 || cfg.HTTP.IdleTimeout != 30*time.Second ||
		len(cfg.HTTP.TrustedProxies) != 0 || cfg.AuthFailuresPerMinute != 30 || cfg.AuthFailureBurst != 20 ||
		cfg.ConsoleSecureCookie || cfg.ConsoleMaxSessionsPerKey != 10 {
		t.Fatalf("defaults: %+v, failures %d/min burst %d, secure cookie %v, sessions %d", cfg.HTTP,
			cfg.AuthFailuresPerMinute, cfg.AuthFailureBurst, cfg.ConsoleSecureCookie, cfg.ConsoleMaxSessionsPerKey)
	}
	cfg, err = loadConfig(env(map[string]string{
		"HTTP_MAX_CONNS": "10", "HTTP_MAX_CONNS_PER_CLIENT": "0", "HTTP_IDLE_TIMEOUT": "5s",
		"HTTP_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.7,2001:db8::/32", "AUTH_FAILURES_PER_MINUTE": "0",
		"CONSOLE_SECURE_COOKIE": "true", "CONSOLE_MAX_SESSIONS_PER_KEY": "2",
	}))
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("2001:db8::/32")}
	if err != nil || cfg.HTTP.MaxConns != 10 || cfg.HTTP.MaxConnsPerClient != 0 || cfg.HTTP.IdleTimeout != 5*time.Second ||
		len(cfg.HTTP.TrustedProxies) != 3 || cfg.HTTP.TrustedProxies[0] != want[0] || cfg.HTTP.TrustedProxies[1] != want[1] ||
		cfg.HTTP.TrustedProxies[2] != want[2] || cfg.AuthFailuresPerMinute != 0 || !cfg.ConsoleSecureCookie || cfg.ConsoleMaxSessionsPerKey != 2 {
		t.Fatalf("set: %+v %v", cfg, err)
	}
	for name, bad := range map[string]string{
		"HTTP_TRUSTED_PROXIES": "proxy.internal", "HTTP_MAX_CONNS": "0", "HTTP_IDLE_TIMEOUT": "0s",
		"HTTP_MAX_CONNS_PER_CLIENT": "-1", "AUTH_FAILURE_BURST": "0", "CONSOLE_MAX_SESSIONS_PER_KEY": "0",
	} {
		if _, err := loadConfig(env(map[string]string{name: bad})); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: %v", name, bad, err)
		}
	}
	// Replicas sign the console's sign-in forms alike: the secret follows API_KEY_ID_SECRET, and is not it.
	a := consoleSecret(config{APIKeyIDSecret: testIDSecret})
	if !bytes.Equal(a, consoleSecret(config{APIKeyIDSecret: testIDSecret})) || bytes.Equal(a, consoleSecret(config{APIKeyIDSecret: testIDSecret + "x"})) ||
		bytes.Contains(a, []byte(testIDSecret)) || consoleSecret(config{}) != nil {
		t.Fatal("the console secret is not derived from API_KEY_ID_SECRET")
	}
}

// TestRunThrottlesRefusedKeys runs the real program: once an address has had AUTH_FAILURE_BURST keys refused,
// its requests get 429 with Retry-After, the right key's included, on the API and the console's sign-in alike,
// and answers say X-Content-Type-Options: nosniff.
func TestRunThrottlesRefusedKeys(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	addr := proctest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "tickets"}, env(map[string]string{
			"DATABASE_URL": db.DSN, "TICKETS_ADDR": addr, "AUTH_FAILURE_BURST": "3", "AUTH_FAILURES_PER_MINUTE": "1",
		}), &syncWriter{w: &out})
	}()
	base := "http://" + addr
	waitHealthy(t, base+"/readyz", done)

	agent := apitest.New(t, base, servicetest.AgentSecret)
	if res := agent.Get("/v1/tickets").Status(t, http.StatusOK); res.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("a JSON answer without nosniff: %v", res.Header)
	}
	for range 3 {
		agent.As("not-a-key").Get("/v1/tickets").Status(t, http.StatusUnauthorized)
	}
	res := agent.Get("/v1/tickets").Status(t, http.StatusTooManyRequests)
	if res.Str(t, "code") != "rate_limited" || res.Header.Get("Retry-After") == "" {
		t.Fatalf("the throttled address with the right key: %s %v", res.Body, res.Header)
	}
	signin, err := http.PostForm(base+"/console/signin", url.Values{"key": {servicetest.ApproverSecret}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(signin.Body)
	signin.Body.Close()
	if signin.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the console's sign-in from the throttled address: %d %s", signin.StatusCode, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestApproverKeysSendNoWrites: on every service as serve builds it, every write but the approval and grant endpoints and a
// person's resolution of an unknown operation (approver writes by design) is 403 forbidden for an approver key, before anything is stored: a valid ticket sent with an approver key makes
// no ticket, and the same request with the agent key does.
func TestApproverKeysSendNoWrites(t *testing.T) {
	t.Parallel()
	w := newRouteWalker(t)
	for _, key := range w.keys {
		method, path, _ := strings.Cut(key, " ")
		if method == http.MethodGet || strings.HasPrefix(path, "/v1/approvals") || strings.HasPrefix(path, "/v1/grants") ||
			strings.HasSuffix(path, "/resolution") {
			continue
		}
		for _, srv := range w.servedBy[key] {
			if srv.name == "provider" {
				continue
			}
			target := pathParam.ReplaceAllString(path, "x")
			res := srv.client.For(t).As(servicetest.ApproverSecret).Do(method, target, "{}", apitest.Key("approver-write"))
			if res.Code != http.StatusForbidden || res.Str(t, "code") != "forbidden" {
				t.Errorf("%s: %s %s with an approver key: %d %s", srv.name, method, target, res.Code, res.Body)
			}
		}
	}
	w.checkNothingWritten(t)
	tickets := w.servedBy["POST /v1/tickets"][0].client.For(t)
	ticket := `{"project":"ops","title":"sent by an approver"}`
	tickets.As(servicetest.ApproverSecret).Post("/v1/tickets", ticket, apitest.Key("approver-ticket")).Status(t, http.StatusForbidden)
	w.checkNothingWritten(t)
	tickets.As(servicetest.AgentSecret).Post("/v1/tickets", ticket, apitest.Key("approver-ticket")).Status(t, http.StatusCreated)
	var n int64
	w.env.DB.DB.Table("tickets").Count(&n)
	if n != 1 {
		t.Fatalf("%d tickets after the agent's write; want 1", n)
	}
}

// TestRunIdleHealthChecksDoNotHoldEveryConnection runs the real program with HTTP_MAX_CONNS=3 and an idle
// timeout of an hour: three keep-alive connections that each asked GET /healthz (no key) and then sit idle do
// not keep an agent's request waiting for that hour. The client gives up after 10 s, far below it, so the
// request must be answered while idle connections hold the places. A connection is closed only to make room:
// one for the agent, and one more if the readiness poll's connection still held a place when the third opened
// (pkg/httpserver's test counts exactly one).
func TestRunIdleHealthChecksDoNotHoldEveryConnection(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	addr := proctest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "tickets"}, env(map[string]string{
			"DATABASE_URL": db.DSN, "TICKETS_ADDR": addr, "HTTP_MAX_CONNS": "3", "HTTP_IDLE_TIMEOUT": "1h",
		}), &syncWriter{w: &out})
	}()
	base := "http://" + addr
	waitHealthy(t, base+"/readyz", done)

	healthz := func(c net.Conn, r *bufio.Reader) error {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		res, err := http.ReadResponse(r, nil)
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	}
	type idleConn struct {
		net.Conn
		r *bufio.Reader
	}
	var idle []idleConn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second)) // a watchdog: a hung test fails
		ic := idleConn{Conn: c, r: bufio.NewReader(c)}
		if err := healthz(ic, ic.r); err != nil {
			t.Fatalf("GET /healthz: %v", err)
		}
		idle = append(idle, ic)
	}

	req, _ := http.NewRequest(http.MethodGet, base+"/v1/tickets", nil)
	req.Header.Set("Authorization", "Bearer "+servicetest.AgentSecret)
	agent := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := agent.Do(req)
	if err != nil {
		t.Fatalf("the agent's request while idle /healthz connections held every place: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the agent's request: %d", res.StatusCode)
	}
	open := 0
	for _, c := range idle {
		if healthz(c, c.r) == nil {
			open++
		}
	}
	if open < 1 {
		t.Errorf("none of the three idle connections is still open; want those not closed to make room")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
