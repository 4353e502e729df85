package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"
)

// before counts the effect at the start of a case; ok is false when the case was marked an error.
func (r *runner) before(ctx context.Context, c *caseRun) (int64, bool) {
	n, err := r.count(ctx, c)
	if err != nil {
		c.error("%v", err)
		return 0, false
	}
	return n, true
}

// start fills the request's body and counts the effect, the first steps of most cases; ok is false when the case
// was marked an error.
func (r *runner) start(ctx context.Context, c *caseRun) (body []byte, n0 int64, ok bool) {
	body, err := r.body(c, r.spec.Body)
	if err != nil {
		c.error("%v", err)
		return nil, 0, false
	}
	n0, ok = r.before(ctx, c)
	return body, n0, ok
}

// effects checks that the effect grew by want since n0, and notes it.
func (r *runner) effects(ctx context.Context, c *caseRun, n0, want int64) {
	n, err := r.count(ctx, c)
	if err != nil {
		c.error("%v", err)
		return
	}
	if n-n0 != want {
		c.fail("effect %d -> %d: want %d new, got %d", n0, n, want, n-n0)
		return
	}
	c.note("effect %d -> %d", n0, n)
}

// first sends the write once and expects success: the cases after it need a stored result.
func (r *runner) first(ctx context.Context, c *caseRun, key string, body []byte) (response, bool) {
	a := r.write(ctx, c, keyOf(key), body)
	if !is2xx(a) {
		c.error("the write itself was not accepted: %s (is the request file right?)", a.describe())
		return a, false
	}
	return a, true
}

// lostResponse: the answer is dropped after the target finished; a retry with the same key gets the same
// answer, marked as a replay, and there is one effect.
func (r *runner) lostResponse(ctx context.Context, c *caseRun) {
	body, n0, ok := r.start(ctx, c)
	if !ok {
		return
	}
	key := r.key(c)
	dropped, ok := r.sendDropped(ctx, c, key, body)
	if !ok {
		return
	}
	retry, attempts := r.settle(ctx, c, key, body)
	c.note("retry: %s%s in %s (%d attempt(s))", retry.describe(), r.replayNote(retry), retry.elapsed.Round(time.Millisecond), attempts)
	switch {
	case retry.err != nil || retry.status != dropped.status:
		c.fail("retry answered %s; the lost answer was %d", retry.describe(), dropped.status)
	case !bytes.Equal(retry.body, dropped.body) && !jsonEqual(retry.body, dropped.body):
		c.fail("retry body differs from the lost answer")
	case !r.replayed(retry):
		c.fail("retry not marked as a replay (%s)", r.spec.ReplayMarker)
	}
	if retry.err == nil && !bytes.Equal(retry.body, dropped.body) && jsonEqual(retry.body, dropped.body) {
		c.note("body equal as JSON, not byte for byte")
	}
	r.effects(ctx, c, n0, 1)
}

// sendDropped sends the write through the dropping proxy and returns the answer the target gave.
func (r *runner) sendDropped(ctx context.Context, c *caseRun, key string, body []byte) (response, bool) {
	p, err := r.startDropProxy()
	if err != nil {
		c.error("proxy: %v", err)
		return response{}, false
	}
	defer p.close()
	got := r.send(ctx, r.newClient(true), p.URL, r.spec.Method, r.spec.Path, r.spec.Headers, keyOf(key), body, c.vars)
	if got.err == nil {
		c.error("the proxy failed to drop the answer (caller got %d)", got.status)
		return response{}, false
	}
	dropped, ok := p.lastDropped(r.opts.RequestTimeout)
	if !ok || dropped.err != nil {
		c.error("the proxy got no answer from the target: %s", dropped.describe())
		return response{}, false
	}
	c.note("proxy dropped %s after the target finished (%s)", dropped.describe(), dropped.elapsed.Round(time.Millisecond))
	if !is2xx(dropped) {
		c.error("the write itself was not accepted: %s (is the request file right?)", dropped.describe())
		return response{}, false
	}
	return dropped, true
}

func (r *runner) replayNote(a response) string {
	if a.err == nil && r.replayed(a) {
		return " replayed"
	}
	return ""
}

// concurrentCopies: N copies of one key at once; one effect; every answer the result or in-progress.
func (r *runner) concurrentCopies(ctx context.Context, c *caseRun) {
	body, n0, ok := r.start(ctx, c)
	if !ok {
		return
	}
	answers, took := r.sendCopies(ctx, c, r.key(c), body)
	tally, results, bad := r.tallyCopies(answers)
	c.note("%d copies in %s: %s", len(answers), took.Round(time.Millisecond), formatTally(tally))
	if bad > 0 {
		c.fail("%d answer(s) neither the result nor 409 with Retry-After", bad)
	}
	if len(results) == 0 {
		c.fail("no copy got the result")
	}
	if n := distinctResults(results); n > 1 {
		c.fail("%d different results for one key", n)
	}
	r.effects(ctx, c, n0, 1)
}

// sendCopies sends the spec's number of copies of one write under key, released together, and says how long
// they took.
func (r *runner) sendCopies(ctx context.Context, c *caseRun, key string, body []byte) ([]response, time.Duration) {
	answers := make([]response, r.spec.Copies)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			answers[i] = r.write(ctx, c, keyOf(key), body)
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	return answers, time.Since(began)
}

// tallyCopies counts the copies' answers by kind: the results (2xx, replayed or not), in progress (409), and
// the bad ones, each by its description.
func (r *runner) tallyCopies(answers []response) (tally map[string]int, results []response, bad int) {
	tally = map[string]int{}
	for _, a := range answers {
		switch {
		case is2xx(a):
			label := fmt.Sprintf("%d", a.status)
			if r.replayed(a) {
				label += " replayed"
			}
			tally[label]++
			results = append(results, a)
		case inProgress(a):
			tally["409 in progress"]++
		default:
			tally[a.describe()]++
			bad++
		}
	}
	return tally, results, bad
}

// distinctResults counts the different results (status and JSON body) among results.
func distinctResults(results []response) int {
	var distinct []response
	for _, a := range results {
		seen := false
		for _, d := range distinct {
			seen = seen || (a.status == d.status && jsonEqual(a.body, d.body))
		}
		if !seen {
			distinct = append(distinct, a)
		}
	}
	return len(distinct)
}

func formatTally(t map[string]int) string {
	labels := make([]string, 0, len(t))
	for l := range t {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	parts := make([]string, len(labels))
	for i, l := range labels {
		parts[i] = fmt.Sprintf("%dx %s", t[l], l)
	}
	return strings.Join(parts, ", ")
}

// restartedCaller: the caller sends, loses the answer and dies; a new caller process reads the key it stored
// and retries: one effect.
func (r *runner) restartedCaller(ctx context.Context, c *caseRun) {
	body, n0, ok := r.start(ctx, c)
	if !ok {
		return
	}
	key := r.key(c)
	state, cleanup, err := r.saveState(c, key, body)
	if err != nil {
		c.error("state file: %v", err)
		return
	}
	defer cleanup()
	if _, ok := r.sendDropped(ctx, c, key, body); !ok {
		return
	}
	var retry response
	if len(r.opts.RestartCommand) > 0 {
		retry, err = r.resumeInProcess(ctx, state)
		if err != nil {
			c.error("new caller process: %v", err)
			return
		}
		c.note("new process %s read the key from its state file", shortCommand(r.opts.RestartCommand))
	} else {
		retry, err = resume(ctx, state, r.opts.Getenv)
		if err != nil {
			c.error("new caller: %v", err)
			return
		}
		c.note("new HTTP client in this process (no process restart) read the key from its state file")
	}
	c.note("its retry: %s%s", retry.describe(), r.replayNote(retry))
	if !is2xx(retry) {
		c.fail("the new caller's retry answered %s", retry.describe())
	}
	r.effects(ctx, c, n0, 1)
}

func shortCommand(cmd []string) string {
	parts := make([]string, len(cmd))
	for i, p := range cmd {
		if i == 0 {
			if j := strings.LastIndexByte(p, '/'); j >= 0 {
				p = p[j+1:]
			}
		}
		parts[i] = p
	}
	return "`" + strings.Join(parts, " ") + "`"
}

// resumeInProcess runs RestartCommand with the state file and reads the answer it prints.
func (r *runner) resumeInProcess(ctx context.Context, state string) (response, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.SettleTimeout+r.opts.RequestTimeout)
	defer cancel()
	args := append(append([]string{}, r.opts.RestartCommand[1:]...), state)
	cmd := exec.CommandContext(ctx, r.opts.RestartCommand[0], args...)
	// The new caller finds its secrets where the first found them: in the environment, never in the state file.
	cmd.Env = append(os.Environ(), r.opts.Env...)
	for _, v := range r.spec.Headers {
		for _, m := range envRef.FindAllStringSubmatch(v, -1) {
			cmd.Env = append(cmd.Env, m[1]+"="+r.opts.Getenv(m[1]))
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return response{}, fmt.Errorf("%v: %s", err, r.mask(lastLine(stderr.String())))
	}
	var a resumed
	if err := json.Unmarshal(lastJSONLine(out), &a); err != nil {
		return response{}, fmt.Errorf("its output is not an answer: %v", err)
	}
	if a.Error != "" {
		return response{}, fmt.Errorf("%s", r.mask(a.Error))
	}
	return response{status: a.Status, header: a.Header, body: a.Body, elapsed: time.Duration(a.ElapsedMS) * time.Millisecond}, nil
}

func lastJSONLine(out []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	return lines[len(lines)-1]
}

// changedPayload: the same key with a different intent is refused (422 or 409), nothing runs, the stored
// result is not shown, and the operation is named when the API names operations.
func (r *runner) changedPayload(ctx context.Context, c *caseRun) {
	body, variant, ok := r.bodyAndVariant(c)
	if !ok {
		return
	}
	n0, ok := r.before(ctx, c)
	if !ok {
		return
	}
	key := r.key(c)
	stored, ok := r.first(ctx, c, key, body)
	if !ok {
		return
	}
	n1, err := r.count(ctx, c)
	if err != nil {
		c.error("%v", err)
		return
	}
	a := r.write(ctx, c, keyOf(key), variant)
	c.note("first %s; variant under the same key: %s", stored.describe(), a.describe())
	r.judgeRefusal(c, stored, a)
	n2, err := r.count(ctx, c)
	switch {
	case err != nil:
		c.error("%v", err)
	case n1-n0 != 1:
		c.fail("effect %d -> %d after the first request: want 1 new", n0, n1)
	case n2 != n1:
		c.fail("the variant ran: effect %d -> %d", n1, n2)
	default:
		c.note("effect %d -> %d, none from the variant", n0, n2)
	}
}

// bodyAndVariant are the case's body and variant, their placeholders filled.
func (r *runner) bodyAndVariant(c *caseRun) (body, variant []byte, ok bool) {
	body, err := r.body(c, r.spec.Body)
	if err != nil {
		c.error("%v", err)
		return nil, nil, false
	}
	variant, err = r.body(c, r.spec.Variant)
	if err != nil {
		c.error("%v", err)
		return nil, nil, false
	}
	return body, variant, true
}

// judgeRefusal checks the answer a to the variant of the write that stored stored: refused with 422 or 409,
// without showing the stored result, and naming the operation when the API names operations.
func (r *runner) judgeRefusal(c *caseRun, stored, a response) {
	if a.err != nil || (a.status != http.StatusUnprocessableEntity && a.status != http.StatusConflict) {
		c.fail("variant not refused with 422 or 409")
	}
	if a.err != nil {
		return
	}
	if leaked(a.body, stored.body, r.spec.Path, c.vars) {
		c.fail("the answer shows the stored result (its id)")
	}
	if op := stored.header.Get("Operation-Id"); op != "" {
		if bytes.Contains(a.body, []byte(op)) || a.header.Get("Operation-Id") == op {
			c.note("names operation %s", op)
		} else {
			c.fail("the API names operations (Operation-Id %s) but the refusal does not", op)
		}
	}
}

// leaked is true when refusal shows the stored result: its whole body, or the stored resource's id where the
// request path did not already name it.
func leaked(refusal, stored []byte, path string, vars map[string]string) bool {
	if jsonEqual(refusal, stored) {
		return true
	}
	id, err := lookup(stored, "id")
	if err != nil {
		return false
	}
	p, _ := fill(path, vars, func(v string) string { return v })
	if other, err := lookup(refusal, "id"); err == nil && fmt.Sprint(other) == fmt.Sprint(id) && !strings.Contains(p, fmt.Sprint(id)) {
		return true
	}
	s, ok := id.(string)
	return ok && len(s) >= 4 && !strings.Contains(p, s) && bytes.Contains(refusal, []byte(s))
}

// equivalentJSON: the same request with keys reordered and other whitespace is the same request.
func (r *runner) equivalentJSON(ctx context.Context, c *caseRun) {
	body, err := r.body(c, r.spec.Body)
	if err != nil {
		c.error("%v", err)
		return
	}
	same, err := reorderJSON(body)
	if err != nil {
		c.error("body: %v", err)
		return
	}
	n0, ok := r.before(ctx, c)
	if !ok {
		return
	}
	key := r.key(c)
	first, ok := r.first(ctx, c, key, body)
	if !ok {
		return
	}
	a := r.write(ctx, c, keyOf(key), same)
	c.note("first %s; reordered and respaced: %s%s", first.describe(), a.describe(), r.replayNote(a))
	if !is2xx(a) {
		c.fail("equivalent JSON treated as a different request")
	}
	r.effects(ctx, c, n0, 1)
}

// missingKeys: no key, an empty key, a 300-character key and a non-ASCII key are each refused with 4xx, and
// nothing runs.
func (r *runner) missingKeys(ctx context.Context, c *caseRun) {
	body, n0, ok := r.start(ctx, c)
	if !ok {
		return
	}
	tries := []struct {
		name string
		key  keyArg
	}{
		{"missing", nil},
		{"empty", keyOf("")},
		{"300 chars", keyOf(strings.Repeat("k", 300))},
		{"non-ASCII", keyOf("clé-" + r.runID)},
	}
	var got []string
	refused := true
	for _, t := range tries {
		a := r.write(ctx, c, t.key, body)
		got = append(got, t.name+" "+a.describe())
		refused = refused && a.err == nil && a.status >= 400 && a.status <= 499
	}
	if refused {
		c.note("%s", strings.Join(got, "; "))
	} else {
		c.fail("%s: want 4xx for each", strings.Join(got, "; "))
	}
	r.effects(ctx, c, n0, 0)
}

// killedWorker: the worker is killed after it claimed the key; retries with the same key settle into one effect.
func (r *runner) killedWorker(ctx context.Context, c *caseRun) {
	body, n0, ok := r.start(ctx, c)
	if !ok {
		return
	}
	key := r.key(c)
	inflight := make(chan response, 1)
	go func() { inflight <- r.write(ctx, c, keyOf(key), body) }()

	hookCtx, cancel := context.WithTimeout(ctx, r.opts.HookTimeout)
	defer cancel()
	if err := r.runKillHook(hookCtx); err != nil {
		c.error("kill hook: %v", r.mask(err.Error()))
		return
	}
	answered := false
	select {
	case a := <-inflight:
		c.note("request in flight: %s", a.describe())
		answered = is2xx(a)
	case <-time.After(r.opts.RequestTimeout):
		c.note("request in flight: no answer within %s", r.opts.RequestTimeout)
	}
	retry, attempts := r.settle(ctx, c, key, body)
	c.note("retry: %s%s after %d attempt(s)", retry.describe(), r.replayNote(retry), attempts)
	if !is2xx(retry) {
		c.fail("retries with the same key did not settle into a result within %s", r.opts.SettleTimeout)
	}
	r.effects(ctx, c, n0, 1)
	if answered && c.verdict == Pass {
		// The worker finished the request: nothing was killed after the claim, so nothing was checked.
		c.verdict = NotChecked
		c.note("the request in flight was answered: the hook did not kill the worker while it held the claim")
	}
}

func (r *runner) runKillHook(ctx context.Context) error {
	if r.opts.KillHook != nil {
		return r.opts.KillHook(ctx)
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", r.spec.KillHook)
	cmd.Env = append(os.Environ(), r.opts.Env...)
	cmd.WaitDelay = 5 * time.Second // a service the hook restarts may keep the hook's output open
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, lastLine(string(out)))
	}
	return nil
}
