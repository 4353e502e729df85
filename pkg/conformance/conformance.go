// Package conformance checks that one write endpoint of any HTTP API can be retried safely: it runs the fault
// cases of the retrysafe design (a lost response, concurrent copies of one key, a restarted caller, a changed
// payload under the same key, equivalent JSON, missing or malformed keys, and a worker killed after its claim)
// against a running target and counts the effect before and after each.
//
// It is the library behind `retrysafe conformance`, and a test can call it directly:
//
//	spec, err := conformance.LoadSpec("orders.json")
//	report, err := conformance.Run(ctx, spec, conformance.Options{Target: srv.URL})
//	report.WriteTable(os.Stdout)
//	if !report.Passed() { t.Fail() }
//
// It talks only to the target and the addresses named in Options.Allow (every connection is checked before it
// is dialled, redirects are never followed), bounds every loop in count and time, and never prints the values of
// the environment variables that headers name, however short. It treats the target as hostile: a value saved from
// its answers reaches the count command only through the environment, never in the command's text, and what it
// answered is printed with control characters escaped (see Spec).
package conformance

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options says where and how to run.
type Options struct {
	// Target is the base URL of the API, http or https.
	Target string
	// Allow names the other addresses (host:port) the run may contact: an absolute count URL's.
	Allow []string
	// Getenv resolves ${NAME} in headers; os.Getenv when nil.
	Getenv func(string) string
	// Copies overrides the spec's number of concurrent copies when positive.
	Copies int
	// RequestTimeout bounds one HTTP request (default 10s); SettleTimeout bounds the retries that wait for a
	// final answer after a fault (default 15s); HookTimeout bounds the kill hook (default 60s).
	RequestTimeout time.Duration
	SettleTimeout  time.Duration
	HookTimeout    time.Duration
	// Counter, when set, counts the effect instead of the spec's count (tests count rows). vars holds unique and
	// the values setup saved.
	Counter func(ctx context.Context, vars map[string]string) (int64, error)
	// KillHook, when set, replaces the spec's kill_hook command: it must kill the worker serving the request in
	// flight after its claim, and return once the service can answer again.
	KillHook func(ctx context.Context) error
	// Env is added to the environment of the count command and the kill hook command.
	Env []string
	// Cases, when not empty, runs only these cases (numbers 1 to 7); the others are left out of the report.
	Cases []int
	// RestartCommand is the new caller process of case 3: it is run with the path of a state file appended and
	// must print Resume's answer (`retrysafe conformance --resume` does). Without it case 3 retries from a new
	// HTTP client and transport in this process, and says so in its evidence.
	RestartCommand []string
}

// Verdict is the outcome of one case.
type Verdict string

// Verdicts. Only Pass and NotChecked let a run succeed; NotChecked is never counted as passed.
const (
	Pass       Verdict = "pass"
	Fail       Verdict = "FAIL"
	NotChecked Verdict = "not checked"
	Error      Verdict = "ERROR"
)

// Case numbers, as the seeds list them.
const (
	CaseLostResponse = iota + 1
	CaseConcurrentCopies
	CaseRestartedCaller
	CaseChangedPayload
	CaseEquivalentJSON
	CaseMissingKeys
	CaseKilledWorker
)

var caseNames = map[int]string{
	CaseLostResponse:     "lost response",
	CaseConcurrentCopies: "concurrent copies",
	CaseRestartedCaller:  "restarted caller",
	CaseChangedPayload:   "changed payload",
	CaseEquivalentJSON:   "equivalent JSON",
	CaseMissingKeys:      "missing/malformed key",
	CaseKilledWorker:     "worker killed after claim",
}

// Result is one case's verdict and the evidence for it.
type Result struct {
	Case     int
	Name     string
	Verdict  Verdict
	Evidence []string
	Duration time.Duration
}

// Report is the outcome of a run.
type Report struct {
	Target  string
	Write   string
	Results []Result
	Started time.Time
	Elapsed time.Duration
}

// Passed is true when every case passed or was not checked.
func (r *Report) Passed() bool {
	for _, res := range r.Results {
		if res.Verdict != Pass && res.Verdict != NotChecked {
			return false
		}
	}
	return true
}

// Verdicts maps case number to verdict, for tests.
func (r *Report) Verdicts() map[int]Verdict {
	out := map[int]Verdict{}
	for _, res := range r.Results {
		out[res.Case] = res.Verdict
	}
	return out
}

// Run runs the seven cases one after another against opts.Target.
func Run(ctx context.Context, spec Spec, opts Options) (*Report, error) {
	if err := spec.check(); err != nil {
		return nil, err
	}
	r, err := newRunner(spec, opts)
	if err != nil {
		return nil, err
	}
	defer r.close()
	rep := &Report{Target: r.target.String(), Write: spec.Name, Started: time.Now()}
	cases := []func(ctx context.Context, c *caseRun){
		CaseLostResponse:     r.lostResponse,
		CaseConcurrentCopies: r.concurrentCopies,
		CaseRestartedCaller:  r.restartedCaller,
		CaseChangedPayload:   r.changedPayload,
		CaseEquivalentJSON:   r.equivalentJSON,
		CaseMissingKeys:      r.missingKeys,
		CaseKilledWorker:     r.killedWorker,
	}
	for n := CaseLostResponse; n <= CaseKilledWorker; n++ {
		if len(opts.Cases) > 0 && !slices.Contains(opts.Cases, n) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, r.runCase(ctx, n, cases[n]))
	}
	rep.Elapsed = time.Since(rep.Started)
	return rep, nil
}

// runner holds what every case shares.
type runner struct {
	spec    Spec
	opts    Options
	target  *url.URL
	allowed map[string]bool
	mu      sync.Mutex     // guards allowed (the proxy adds its own address)
	secrets *regexp.Regexp // matches every form of every secret (secretPattern); nil when there is none
	runID   string
	client  *http.Client
	marker  [2]string // replay marker name and value ("" = any value)
}

func newRunner(spec Spec, opts Options) (*runner, error) {
	if err := opts.prepare(); err != nil {
		return nil, err
	}
	if opts.Copies > 0 {
		spec.Copies = opts.Copies
	}
	target, err := parseBase(opts.Target)
	if err != nil {
		return nil, err
	}
	r := &runner{spec: spec, opts: opts, target: target, allowed: map[string]bool{hostPort(target): true}}
	if err := r.allowNamed(opts.Allow); err != nil {
		return nil, err
	}
	if err := r.collectSecrets(); err != nil {
		return nil, err
	}
	if err := r.checkCounter(); err != nil {
		return nil, err
	}
	name, value, _ := strings.Cut(spec.ReplayMarker, ":")
	r.marker = [2]string{strings.TrimSpace(name), strings.TrimSpace(value)}
	var id [4]byte
	_, _ = rand.Read(id[:])
	r.runID = "c" + hex.EncodeToString(id[:])
	r.client = r.newClient(false)
	return r, nil
}

// prepare fills in the options' defaults and checks the copies and cases asked for.
func (o *Options) prepare() error {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Copies > 0 && (o.Copies < 2 || o.Copies > maxCopies) {
		return fmt.Errorf("copies must be 2 to %d", maxCopies)
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 10 * time.Second
	}
	if o.SettleTimeout <= 0 {
		o.SettleTimeout = 15 * time.Second
	}
	if o.HookTimeout <= 0 {
		o.HookTimeout = 60 * time.Second
	}
	for _, n := range o.Cases {
		if n < CaseLostResponse || n > CaseKilledWorker {
			return fmt.Errorf("case %d: cases are numbered 1 to 7", n)
		}
	}
	return nil
}

// allowNamed lets the run contact the addresses the user named (host:port) besides the target.
func (r *runner) allowNamed(addrs []string) error {
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("allow %q: want host:port", a)
		}
		r.allow(a)
	}
	return nil
}

// checkCounter checks that the run has a way to count the effect, and that a count url is an address it may
// contact.
func (r *runner) checkCounter() error {
	count := r.spec.Count
	if r.opts.Counter != nil || count.Command != "" {
		return nil
	}
	if count.URL == "" {
		return fmt.Errorf("request file: count is required: a url with length or field, or a command")
	}
	u, err := r.countURL()
	if err != nil {
		return fmt.Errorf("count url: %w", err)
	}
	if !r.isAllowed(hostPort(u)) {
		return fmt.Errorf("count url: %s is not the target; name it with --allow %s to let the run contact it", hostPort(u), hostPort(u))
	}
	return nil
}

func parseBase(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("target %q: want an http or https URL", s)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("target %q: no query, fragment or credentials in the URL", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}

func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return strings.ToLower(net.JoinHostPort(u.Hostname(), port))
}

func (r *runner) isAllowed(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.allowed[strings.ToLower(addr)]
}

func (r *runner) allow(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.allowed[strings.ToLower(addr)] = true
}

// errNotAllowed is returned for a connection to an address the user did not name.
var errNotAllowed = errors.New("conformance: address not named by --target or --allow")

// newClient returns a client that dials only allowed addresses and never follows redirects. fresh disables
// keep-alives, so a dropped answer cannot be retried by the transport on a reused connection.
func (r *runner) newClient(fresh bool) *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if !r.isAllowed(addr) {
				return nil, fmt.Errorf("%w: %s", errNotAllowed, addr)
			}
			return dialer.DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: maxCopies,
		DisableKeepAlives:   fresh,
		ForceAttemptHTTP2:   true,
	}
	return &http.Client{
		Transport:     tr,
		Timeout:       r.opts.RequestTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (r *runner) close() { r.client.CloseIdleConnections() }

// collectSecrets resolves every ${NAME} the spec's headers use, so that their values can be masked in output.
func (r *runner) collectSecrets() error {
	var maps []map[string]string
	maps = append(maps, r.spec.Headers, r.spec.Count.Headers)
	for _, st := range r.spec.Setup {
		maps = append(maps, st.Headers)
	}
	var secrets []string
	for _, h := range maps {
		for _, v := range h {
			for _, m := range envRef.FindAllStringSubmatch(v, -1) {
				val := r.opts.Getenv(m[1])
				if val == "" {
					return fmt.Errorf("environment variable %s (named in a header) is empty or unset", m[1])
				}
				secrets = append(secrets, val)
			}
		}
	}
	r.secrets = secretPattern(secrets)
	return nil
}

// secretPattern matches the secrets in every form a target might echo them in: as sent, in any case (upper-case
// included), base64 (standard and URL alphabets, padded or not) and hex (either case). Longest first: a form
// that holds another is masked whole, not left with the other's remainder.
func secretPattern(secrets []string) *regexp.Regexp {
	var forms []string
	for _, sec := range secrets {
		b := []byte(sec)
		forms = append(forms, sec, hex.EncodeToString(b),
			base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
			base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b))
	}
	if len(forms) == 0 {
		return nil
	}
	slices.SortFunc(forms, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	forms = slices.Compact(forms)
	for i, f := range forms {
		forms[i] = regexp.QuoteMeta(f)
	}
	return regexp.MustCompile(`(?i)` + strings.Join(forms, "|"))
}

// mask removes secret values from text meant for output. Every secret is masked, however short: a short one
// garbles the evidence where its characters recur, which is better than printing it.
func (r *runner) mask(s string) string {
	if r.secrets == nil {
		return s
	}
	return r.secrets.ReplaceAllLiteralString(s, "***")
}

// countURL is the count's url with its ${NAME} references read from the environment (a provider's address that
// moves with the demo, "${PROVIDER_URL}/admin/counters"), resolved against the target.
func (r *runner) countURL() (*url.URL, error) {
	var missing string
	ref := envRef.ReplaceAllStringFunc(r.spec.Count.URL, func(m string) string {
		name := envRef.FindStringSubmatch(m)[1]
		v := r.opts.Getenv(name)
		if v == "" && missing == "" {
			missing = name
		}
		return v
	})
	if missing != "" {
		return nil, fmt.Errorf("${%s} is unset", missing)
	}
	return r.resolve(ref)
}

func (r *runner) resolve(ref string) (*url.URL, error) {
	if strings.HasPrefix(ref, "/") {
		u := *r.target
		p, q, _ := strings.Cut(ref, "?")
		u.Path = r.target.Path + p
		u.RawQuery = q
		return &u, nil
	}
	u, err := url.Parse(ref)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q: want a path or an http(s) URL", ref)
	}
	return u, nil
}

// caseRun is one case in progress: its vars (unique and the values setup saved) and its evidence.
type caseRun struct {
	n        int
	vars     map[string]string
	evidence []string
	verdict  Verdict
	keys     int
}

func (c *caseRun) note(format string, args ...any) {
	c.evidence = append(c.evidence, fmt.Sprintf(format, args...))
}

// fail records a failed check; the case keeps running to gather evidence unless the caller returns.
func (c *caseRun) fail(format string, args ...any) {
	if c.verdict != Error {
		c.verdict = Fail
	}
	c.note(format, args...)
}

func (c *caseRun) error(format string, args ...any) {
	c.verdict = Error
	c.note(format, args...)
}

// key returns a new idempotency key of this run and case.
func (r *runner) key(c *caseRun) string {
	c.keys++
	return fmt.Sprintf("%s-%d-%d", r.runID, c.n, c.keys)
}

func (r *runner) runCase(ctx context.Context, n int, run func(context.Context, *caseRun)) Result {
	start := time.Now()
	c := &caseRun{n: n, vars: map[string]string{"unique": fmt.Sprintf("%s-%d", r.runID, n)}, verdict: Pass}
	caseCtx, cancel := context.WithTimeout(ctx, r.opts.SettleTimeout+r.opts.HookTimeout+4*r.opts.RequestTimeout)
	defer cancel()
	if n == CaseKilledWorker && r.opts.KillHook == nil && r.spec.KillHook == "" {
		c.verdict = NotChecked
		c.note("no kill hook: give kill_hook in the request file to check it")
	} else if err := r.setup(caseCtx, c); err != nil {
		c.error("setup: %v", err)
	} else {
		run(caseCtx, c)
	}
	ev := make([]string, len(c.evidence))
	for i, e := range c.evidence {
		ev[i] = escapeControls(r.mask(e))
	}
	return Result{Case: n, Name: caseNames[n], Verdict: c.verdict, Evidence: ev, Duration: time.Since(start)}
}

// setup runs the spec's setup steps for one case, saving the values they name.
func (r *runner) setup(ctx context.Context, c *caseRun) error {
	for i, st := range r.spec.Setup {
		body := []byte(nil)
		if len(st.Body) > 0 {
			b, err := fill(string(st.Body), c.vars, jsonString)
			if err != nil {
				return err
			}
			body = []byte(b)
		}
		resp := r.send(ctx, r.client, r.target, st.Method, st.Path, st.Headers, nil, body, c.vars)
		if resp.err != nil {
			return fmt.Errorf("step %d: %v", i+1, resp.err)
		}
		if resp.status < 200 || resp.status > 299 {
			return fmt.Errorf("step %d: %s %s answered %s", i+1, st.Method, st.Path, resp.describe())
		}
		for name, path := range st.Save {
			v, err := lookup(resp.body, path)
			if err != nil {
				return fmt.Errorf("step %d: save %s: %v", i+1, name, err)
			}
			switch x := v.(type) {
			case string:
				c.vars[name] = x
			case json.Number:
				c.vars[name] = x.String()
			default:
				return fmt.Errorf("step %d: save %s: %s is not a string or number", i+1, name, path)
			}
		}
	}
	return nil
}

// response is what one attempt got.
type response struct {
	status  int
	header  http.Header
	body    []byte
	err     error
	elapsed time.Duration
}

func (a response) describe() string {
	if a.err != nil {
		return "no answer (" + a.err.Error() + ")"
	}
	s := strconv.Itoa(a.status)
	if code := problemCode(a.body); code != "" {
		s += " " + code
	}
	return s
}

func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(body, &p) == nil && len(p.Code) <= 64 {
		return p.Code
	}
	return ""
}

// keyArg is the idempotency key of one attempt: absent (nil), or a value (possibly empty or malformed).
type keyArg = *string

func keyOf(k string) keyArg { return &k }

// send makes one attempt at base+path with the spec's headers (or those given), the key and the body.
func (r *runner) send(ctx context.Context, client *http.Client, base *url.URL, method, path string, headers map[string]string, key keyArg, body []byte, vars map[string]string) response {
	start := time.Now()
	u, err := fillURL(base, path, vars)
	if err != nil {
		return response{err: err}
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return response{err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		// net/http resends a request with an Idempotency-Key by itself when a reused connection breaks; each
		// attempt here must be exactly one, so the body cannot be rewound.
		req.GetBody = nil
	}
	for name, v := range headers {
		v, err := expandHeader(v, vars, r.opts.Getenv)
		if err != nil {
			return response{err: err}
		}
		req.Header.Set(name, v)
	}
	if key != nil {
		req.Header[r.spec.KeyHeader] = []string{*key}
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{err: errors.New(r.mask(shortError(err))), elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return response{err: errors.New(r.mask(shortError(err))), elapsed: time.Since(start)}
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data, elapsed: time.Since(start)}
}

// fillURL is base with ref (a path and an optional query, with placeholders) appended. Each value is escaped
// once, as a path segment or a query value, so a value from the target stays one segment or one value: its '/',
// '?', '&' or '#' cannot change where the request goes.
func fillURL(base *url.URL, ref string, vars map[string]string) (*url.URL, error) {
	p, q, _ := strings.Cut(ref, "?")
	p, err := fill(p, vars, url.PathEscape)
	if err != nil {
		return nil, err
	}
	q, err = fill(q, vars, url.QueryEscape)
	if err != nil {
		return nil, err
	}
	u := *base
	u.RawPath = base.EscapedPath() + p
	if u.Path, err = url.PathUnescape(u.RawPath); err != nil {
		return nil, fmt.Errorf("path %q: %v", ref, err)
	}
	u.RawQuery = q
	return &u, nil
}

// shortError drops the request URL that url.Error repeats.
func shortError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// write sends the spec's write with key and body to the target.
func (r *runner) write(ctx context.Context, c *caseRun, key keyArg, body []byte) response {
	return r.send(ctx, r.client, r.target, r.spec.Method, r.spec.Path, r.spec.Headers, key, body, c.vars)
}

// body returns the spec's body (or variant) with the case's placeholders filled.
func (r *runner) body(c *caseRun, raw json.RawMessage) ([]byte, error) {
	b, err := fill(string(raw), c.vars, jsonString)
	return []byte(b), err
}

// replayed is true when a carries the replay marker.
func (r *runner) replayed(a response) bool {
	v := a.header.Get(r.marker[0])
	if r.marker[1] == "" {
		return v != ""
	}
	return strings.EqualFold(v, r.marker[1])
}

// inProgress is the documented "still running" answer: 409 with Retry-After.
func inProgress(a response) bool {
	return a.err == nil && a.status == http.StatusConflict && a.header.Get("Retry-After") != ""
}

// settle retries the write with key until it gets an answer other than in-progress, no answer or a gateway's
// 502/503/504 (the service may be restarting), within SettleTimeout and at most 50 attempts.
func (r *runner) settle(ctx context.Context, c *caseRun, key string, body []byte) (response, int) {
	deadline := time.Now().Add(r.opts.SettleTimeout)
	var a response
	attempts := 0
	for attempts < 50 {
		attempts++
		a = r.write(ctx, c, keyOf(key), body)
		if a.err == nil && !inProgress(a) && !unavailable(a) {
			return a, attempts
		}
		wait := 200 * time.Millisecond
		if inProgress(a) {
			if s, err := strconv.Atoi(a.header.Get("Retry-After")); err == nil && s > 0 {
				wait = min(time.Duration(s)*time.Second, time.Second)
			}
		}
		if time.Now().Add(wait).After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return a, attempts
		case <-time.After(wait):
		}
	}
	return a, attempts
}

func unavailable(a response) bool {
	return a.status == http.StatusBadGateway || a.status == http.StatusServiceUnavailable || a.status == http.StatusGatewayTimeout
}

func is2xx(a response) bool { return a.err == nil && a.status >= 200 && a.status <= 299 }
