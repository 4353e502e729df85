package consoletest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/consoletest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/deploys"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// browser is the package's one chromium; nil when RETRYSAFE_SKIP_BROWSER=1 and none could be found.
var browser *consoletest.Browser

func TestMain(m *testing.M) {
	b, err := consoletest.Start()
	switch {
	case err == nil:
		browser = b
	case os.Getenv(consoletest.SkipVar) == "1":
		fmt.Fprintf(os.Stderr, "consoletest: browser tests skipped (%s=1): %v\n", consoletest.SkipVar, err)
	default:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if browser != nil {
		browser.Close()
	}
	os.Exit(code)
}

func person(t *testing.T) context.Context {
	t.Helper()
	if browser == nil {
		t.Skipf("no browser on this machine (%s=1)", consoletest.SkipVar)
	}
	return browser.Person(t)
}

func signIn(t *testing.T, tab context.Context, base, secret string) {
	t.Helper()
	consoletest.Run(t, tab,
		chromedp.Navigate(base+"/console/signin"),
		chromedp.WaitVisible(chromedp.ID("key")),
		chromedp.SendKeys(chromedp.ID("key"), secret),
		chromedp.Click(chromedp.ID("signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("header nav")),
	)
}

// page opens path and returns the text of main.
func page(t *testing.T, tab context.Context, base, path string) string {
	t.Helper()
	consoletest.Run(t, tab, chromedp.Navigate(base+path))
	return consoletest.Get(t, tab, chromedp.Text(chromedp.CSS("main")))
}

func exists(t *testing.T, tab context.Context, selector string) bool {
	t.Helper()
	return consoletest.Get(t, tab, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, selector))) > 0
}

// sessionCookie reads the tab's HttpOnly session cookie, as a forger who stole it would hold it.
func sessionCookie(t *testing.T, tab context.Context) *network.Cookie {
	t.Helper()
	res := consoletest.Get(t, tab, func(ctx context.Context, target *chromedp.Target) (network.GetCookiesResult, error) {
		return cdp.Call(ctx, target, network.GetCookies, network.GetCookiesParams{})
	})
	for _, c := range res.Cookies {
		if c.Name == "retrysafe_console" {
			if !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict || c.Path != "/console" {
				t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/console", c)
			}
			return c
		}
	}
	t.Fatalf("no session cookie in %v", res.Cookies)
	return nil
}

// csrfToken is the token the tab's pages carry in their forms.
func csrfToken(t *testing.T, tab context.Context) string {
	t.Helper()
	return consoletest.Get(t, tab, chromedp.Evaluate[string](`document.querySelector('input[name=csrf_token]').value`))
}

// post sends a form POST outside the browser with the session cookie, as a forged request would.
func post(t *testing.T, base, path string, cookie *network.Cookie, form url.Values) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: cookie.Name, Value: cookie.Value})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

func approvalState(t *testing.T, env *servicetest.Env, id string) string {
	t.Helper()
	var state string
	if err := env.DB.Raw(`SELECT state FROM approvals WHERE id = ?`, id).Scan(&state).Error; err != nil {
		t.Fatal(err)
	}
	return state
}

func artifact(n int) string { return fmt.Sprintf("registry.example.com/shop/api@sha256:%064x", n) }

func deployBody(n int) string {
	return fmt.Sprintf(`{"service":"api","environment":"production","artifact":%q}`, artifact(n))
}

func requestApproval(t *testing.T, c *apitest.Client, key, body string) string {
	t.Helper()
	req := fmt.Sprintf(`{"method":"POST","path":"/v1/deploys","idempotency_key":%q,"body":%s}`, key, body)
	return c.Post("/v1/approvals", req, apitest.Key("approval-"+key)).Status(t, http.StatusCreated).Str(t, "id")
}

func waitVersion(t *testing.T, agent *apitest.Client, version float64) map[string]any {
	t.Helper()
	var env map[string]any
	servicetest.Eventually(t, fmt.Sprintf("production at version %v", version), func() bool {
		env = agent.Get("/v1/environments/production").Status(t, http.StatusOK).JSON(t)
		return env["version"] == version
	})
	return env
}

// TestApproveProductionDeploy: an approver signs in, reads a production deploy in the inbox (what runs, that it
// can be rolled back, the exact body), approves it, and the deploy runs. The agent key sees the inbox without
// buttons and its forged POST is refused; a POST without the CSRF token is refused; another account sees 404s.
func TestApproveProductionDeploy(t *testing.T) {
	t.Parallel()
	approverTab, agentTab, otherTab := person(t), person(t), person(t)
	env := servicetest.New(t)
	svc, err := deploys.New(env.Deps, deploys.Config{
		ApprovalEnvironments: []string{"production"}, ApprovalTTL: time.Hour,
		Steps: 2, StepDuration: 20 * time.Millisecond, LockLease: 5 * time.Second, Heartbeat: 10 * time.Millisecond,
		PollInterval: 10 * time.Millisecond, Workers: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	env.RunWorkers(t, service.Background{}, svc)
	agent := env.Serve(t, svc)
	approver := agent.As(servicetest.ApproverSecret)
	base := env.URL

	// Version 1 runs in production, approved through the API.
	first := requestApproval(t, agent, "deploy-1", deployBody(1))
	approver.Post("/v1/approvals/"+first+"/approve", nil).Status(t, http.StatusOK)
	agent.Post("/v1/deploys", deployBody(1), apitest.Key("deploy-1"), apitest.Header("Approval-Id", first)).Status(t, http.StatusAccepted)
	current := waitVersion(t, agent, 1)["current_deploy_id"].(string)

	// Version 2 waits for a person.
	second := requestApproval(t, agent, "deploy-2", deployBody(2))
	signIn(t, approverTab, base, servicetest.ApproverSecret)
	inbox := page(t, approverTab, base, "/console/approvals")
	for _, want := range []string{
		"Deploy api " + artifact(2) + " to production", "POST /v1/deploys", "deploy-2",
		"yes, to deploy " + current, `"artifact":"` + artifact(2) + `"`, "agent:",
	} {
		if !strings.Contains(inbox, want) {
			t.Fatalf("inbox lacks %q:\n%s", want, inbox)
		}
	}
	if strings.Contains(inbox, servicetest.ApproverSecret) || strings.Contains(inbox, servicetest.AgentSecret) {
		t.Fatal("a secret appears in the inbox")
	}
	consoletest.Screenshot(t, approverTab, "inbox")

	// The agent key reads the same inbox without a button, and a POST it forges is refused.
	signIn(t, agentTab, base, servicetest.AgentSecret)
	agentInbox := page(t, agentTab, base, "/console/approvals")
	if !strings.Contains(agentInbox, "Deploy api "+artifact(2)) || !exists(t, agentTab, "#read-only") ||
		exists(t, agentTab, "#approve-"+second) || exists(t, agentTab, "button.approve") {
		t.Fatalf("agent inbox shows buttons or lacks the approval:\n%s", agentInbox)
	}
	agentCookie := sessionCookie(t, agentTab)
	if code := post(t, base, "/console/approvals/"+second+"/approve", agentCookie,
		url.Values{"csrf_token": {csrfToken(t, agentTab)}}); code != http.StatusForbidden {
		t.Fatalf("agent's forged approve = %d; want 403", code)
	}
	// A POST without the CSRF token is refused, even with the approver's session.
	if code := post(t, base, "/console/approvals/"+second+"/approve", sessionCookie(t, approverTab), nil); code != http.StatusForbidden {
		t.Fatalf("approve without CSRF token = %d; want 403", code)
	}
	if got := approvalState(t, env, second); got != "pending" {
		t.Fatalf("approval after refused POSTs is %s; want pending", got)
	}

	// The approver approves in the browser; the deploy then runs.
	consoletest.Run(t, approverTab,
		chromedp.Click(chromedp.ID("approve-"+second)),
		chromedp.WaitVisible(chromedp.ID("done")),
	)
	if got := approvalState(t, env, second); got != "approved" {
		t.Fatalf("approval after the click is %s; want approved", got)
	}
	var decided int64
	env.DB.Raw(`SELECT count(*) FROM approval_events WHERE approval_id = ? AND type = 'approved' AND actor LIKE 'approver:%'`, second).Scan(&decided)
	if decided != 1 {
		t.Fatalf("%d approved records in the approval's audit chain; want 1", decided)
	}
	res := agent.Post("/v1/deploys", deployBody(2), apitest.Key("deploy-2"), apitest.Header("Approval-Id", second)).Status(t, http.StatusAccepted)
	opID := res.Header.Get("Operation-Id")
	waitVersion(t, agent, 2)

	envPage := page(t, approverTab, base, "/console/environments/production")
	for _, want := range []string{"Version\n2", artifact(2), "free: no deploy holds it", "Recent deploys", opID} {
		if !strings.Contains(strings.ReplaceAll(envPage, "\t", ""), want) && !strings.Contains(envPage, want) {
			t.Fatalf("environment page lacks %q:\n%s", want, envPage)
		}
	}
	consoletest.Screenshot(t, approverTab, "environment")
	if list := page(t, approverTab, base, "/console/environments"); !strings.Contains(list, "production") || !strings.Contains(list, artifact(2)) {
		t.Fatalf("environments page:\n%s", list)
	}
	opPage := page(t, approverTab, base, "/console/operations/"+opID)
	for _, want := range []string{"approval_checked", "succeeded", "intact", second} {
		if !strings.Contains(opPage, want) {
			t.Fatalf("operation page lacks %q:\n%s", want, opPage)
		}
	}

	// An approval granted but not used yet can be revoked from the inbox; a request of the approver's own key
	// shows no button to it.
	third := requestApproval(t, agent, "deploy-3", deployBody(3))
	approver.Post("/v1/approvals/"+third+"/approve", nil).Status(t, http.StatusOK)
	own := requestApproval(t, approver, "deploy-own", deployBody(4))
	inbox = page(t, approverTab, base, "/console/approvals")
	if !strings.Contains(inbox, "You asked for this one") || exists(t, approverTab, "#approve-"+own) {
		t.Fatalf("the approver's own request offers a decision:\n%s", inbox)
	}
	consoletest.Run(t, approverTab,
		chromedp.Click(chromedp.ID("revoke-"+third)),
		chromedp.WaitVisible(chromedp.ID("done")),
	)
	if got := approvalState(t, env, third); got != "revoked" {
		t.Fatalf("approval after revoke is %s; want revoked", got)
	}
	agent.Post("/v1/deploys", deployBody(3), apitest.Key("deploy-3"), apitest.Header("Approval-Id", third)).Status(t, http.StatusForbidden)

	// Another account: the approval, the operation and the environment are 404s.
	signIn(t, otherTab, base, servicetest.OtherApproverSecret)
	if p := page(t, otherTab, base, "/console/approvals"); strings.Contains(p, "deploy-2") || strings.Contains(p, second) {
		t.Fatalf("another account's inbox shows acct_demo's approval:\n%s", p)
	}
	for _, path := range []string{"/console/operations/" + opID, "/console/environments/production"} {
		if p := page(t, otherTab, base, path); !strings.Contains(p, "404") || strings.Contains(p, artifact(2)) {
			t.Fatalf("another account's %s: %s", path, p)
		}
	}
	if p := page(t, otherTab, base, "/console/operations?q=deploy-2"); strings.Contains(p, opID) {
		t.Fatalf("another account's search finds acct_demo's operation:\n%s", p)
	}
	if code := post(t, base, "/console/approvals/"+second+"/revoke", sessionCookie(t, otherTab),
		url.Values{"csrf_token": {csrfToken(t, otherTab)}}); code != http.StatusNotFound {
		t.Fatalf("another account's revoke = %d; want 404", code)
	}
}

// TestUserTextIsEscaped: a ticket title, an idempotency key and an approval body holding markup show as text,
// and no script runs.
func TestUserTextIsEscaped(t *testing.T) {
	t.Parallel()
	tab := person(t)
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	agent := env.Serve(t, svc)
	const payload = `<script>document.title="pwned"</script><img src=x onerror="document.title='pwned'">`
	key := `<script>document.title="pwned"</script>`
	body, _ := json.Marshal(map[string]string{"project": "ops", "title": payload})
	res := agent.Post("/v1/tickets", string(body), apitest.Key(key)).Status(t, http.StatusCreated)
	opID := res.Header.Get("Operation-Id")
	// An approval whose body and summary carry markup, as any service's write could propose.
	err = env.DB.Exec(`INSERT INTO approvals (id, account_id, method, path, route, idempotency_key, fingerprint, summary,
state, requested_by, expires_at, body) VALUES ('apv_xss', 'acct_demo', 'POST', '/v1/x', '/v1/x', ?, 'sha256:x', ?::jsonb,
'pending', 'agent:someone', now() + interval '1 hour', ?)`, key, `{"action":"`+`<b>bold</b>","note":`+mustJSON(payload)+`}`, string(body)).Error
	if err != nil {
		t.Fatal(err)
	}

	signIn(t, tab, env.URL, servicetest.ApproverSecret)
	for _, path := range []string{"/console/approvals", "/console/operations", "/console/operations?q=" + url.QueryEscape(key), "/console/operations/" + opID} {
		text := page(t, tab, env.URL, path)
		if !strings.Contains(text, `<script>document.title="pwned"</script>`) {
			t.Fatalf("%s does not show the markup as text:\n%s", path, text)
		}
		title := consoletest.Get(t, tab, chromedp.Title())
		if title == "pwned" || exists(t, tab, "main script") || exists(t, tab, "main img") || exists(t, tab, "main b") {
			t.Fatalf("%s: user text became markup (title %q)", path, title)
		}
	}
}

func mustJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestUnknownCaptureTimeline is docs/payments.md's lost capture: the provider drops its answer, the capture is 202
// unknown, and its page shows what happened: the dispatch, no response, the unknown outcome, the chain intact.
func TestUnknownCaptureTimeline(t *testing.T) {
	t.Parallel()
	tab := person(t)
	bin := proctest.Build(t)
	prov := proctest.Start(t, bin, []string{"provider"}, map[string]string{"PROVIDER_FAULT_INJECTION": "true"}, "PROVIDER_ADDR")
	env := servicetest.New(t)
	client := provider.NewClientHTTP(prov.URL, "sk_test_console", apitest.HTTPClient(t, 2*time.Second))
	svc, err := payments.New(env.Deps, payments.Config{Provider: client, ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	agent := env.Serve(t, svc)
	var in struct{ ID string }
	agent.Post("/v1/payment_intents", `{"order_id":"o-lost","amount":"25.00","currency":"USD"}`, apitest.Key("create-o-lost")).
		Status(t, http.StatusCreated).Decode(t, &in)
	if err := client.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDrop, Count: 1}); err != nil {
		t.Fatal(err)
	}
	var op opstatus.Operation
	agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap-1")).Status(t, http.StatusAccepted).Decode(t, &op)
	if op.State != opstatus.StateUnknown {
		t.Fatalf("capture = %+v; want unknown", op)
	}

	// A capture above the approval threshold waits in the inbox, its amount, currency, intent and order first.
	var big struct{ ID string }
	agent.Post("/v1/payment_intents", `{"order_id":"o-big","amount":"2000.00","currency":"USD"}`, apitest.Key("create-o-big")).
		Status(t, http.StatusCreated).Decode(t, &big)
	agent.Post("/v1/approvals", `{"method":"POST","path":"/v1/payment_intents/`+big.ID+`/capture","idempotency_key":"cap-big","body":{}}`,
		apitest.Key("approval-cap-big")).Status(t, http.StatusCreated)

	signIn(t, tab, env.URL, servicetest.ApproverSecret)
	if inbox := page(t, tab, env.URL, "/console/approvals"); !strings.Contains(inbox, "Capture 2000.00 USD of intent "+big.ID+" (order o-big)") {
		t.Fatalf("inbox lacks the capture's summary:\n%s", inbox)
	}
	list := page(t, tab, env.URL, "/console/operations")
	if i := strings.Index(list, op.ID); i < 0 || i > strings.Index(list, "create-o-lost") {
		t.Fatalf("the unknown capture is not listed first:\n%s", list)
	}
	if only := page(t, tab, env.URL, "/console/operations?state=unknown"); !strings.Contains(only, op.ID) || strings.Contains(only, "create-o-lost") {
		t.Fatalf("state=unknown filter:\n%s", only)
	}
	timeline := page(t, tab, env.URL, "/console/operations/"+op.ID)
	last := -1
	for _, want := range []string{"dispatch_started", "dispatch_sent_no_response", "outcome_unknown"} {
		i := strings.Index(timeline, want)
		if i < last {
			t.Fatalf("timeline lacks %q after the records before it:\n%s", want, timeline)
		}
		last = i
	}
	if !strings.Contains(timeline, "intact") || !strings.Contains(timeline, "unknown") {
		t.Fatalf("timeline page lacks the state or the chain check:\n%s", timeline)
	}
	consoletest.Screenshot(t, tab, "operation-timeline")
}
