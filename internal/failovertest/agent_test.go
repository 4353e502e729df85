package failovertest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/payments"
)

// agentPayment is one payment the real agent binary made: `retrysafe agent do` for the intent, then for its
// capture, each result as the agent printed it (its journal's view).
type agentPayment struct {
	order           string
	amountMinor     int64
	intent, capture agent.Result
	capturedAt      time.Time
}

// agentDriver runs payments through `retrysafe agent do` with one journal and the demo tools file, one after
// the other, as an agent working through its task list does.
type agentDriver struct {
	s       *stack
	name    string
	journal string
	tools   string

	mu       sync.Mutex
	payments []*agentPayment
}

func newAgentDriver(t *testing.T, s *stack, name string) *agentDriver {
	_, file, _, _ := runtime.Caller(0)
	return &agentDriver{s: s, name: name, journal: filepath.Join(t.TempDir(), "agent.journal"),
		tools: filepath.Join(filepath.Dir(file), "..", "..", "pkg", "agent", "demo-tools.yaml")}
}

// run runs `retrysafe agent` with args on the journal and the tools file: its exit code, standard output and
// standard error.
func (a *agentDriver) run(t *testing.T, sub string, args ...string) (int, string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.s.bin, append([]string{"agent", sub, "--journal", a.journal, "--tools", a.tools}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PAYMENTS_URL=" + a.s.payments.BaseURL, "TICKETS_URL=" + a.s.tickets.BaseURL,
		"DEPLOYS_URL=" + a.s.deploys.BaseURL, "AGENT_API_KEY=" + servicetest.AgentSecret, "AGENT_MAX_WAIT=120s", "AGENT_LOCK_WAIT=120s"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), stdout.String(), stderr.String()
	case err != nil:
		t.Errorf("agent %s: %v", sub, err)
		return -1, stdout.String(), stderr.String()
	}
	return 0, stdout.String(), stderr.String()
}

// do runs one action and returns the agent's result.
func (a *agentDriver) do(t *testing.T, action, tool, args string) (agent.Result, bool) {
	code, stdout, stderr := a.run(t, "do", "--action", action, tool, args)
	var r agent.Result
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Errorf("agent do %s: exit %d, %v\n%s\n%s", action, code, err, stdout, stderr)
		return r, false
	}
	return r, true
}

// load makes payments until stop is closed; the returned function waits for the one in progress.
func (a *agentDriver) load(t *testing.T, stop <-chan struct{}) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			p := &agentPayment{order: fmt.Sprintf("%s-%03d", a.name, n), amountMinor: 2000 + int64(n)}
			var ok bool
			p.intent, ok = a.do(t, "intent-"+p.order, "create_payment_intent", fmt.Sprintf(
				`{"order_id":%q,"amount":"%d.%02d","currency":"USD"}`, p.order, p.amountMinor/100, p.amountMinor%100))
			if !ok {
				return
			}
			a.mu.Lock()
			a.payments = append(a.payments, p)
			a.mu.Unlock()
			if p.intent.State != "succeeded" {
				continue
			}
			var in struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal(p.intent.Body, &in)
			capture, ok := a.do(t, "capture-"+p.order, "capture_payment", fmt.Sprintf(`{"intent_id":%q}`, in.ID))
			a.mu.Lock()
			p.capture, p.capturedAt = capture, time.Now()
			a.mu.Unlock()
			if !ok {
				return
			}
		}
	})
	return wg.Wait
}

// capturedSince counts the payments whose capture the agent settled succeeded after since.
func (a *agentDriver) capturedSince(since time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, p := range a.payments {
		if p.capture.State == "succeeded" && p.capturedAt.After(since) {
			n++
		}
	}
	return n
}

// verify runs `retrysafe agent verify` on the journal: how many acknowledged actions the services had lost and
// how many the agent made again. It exits 0 when nothing was lost, 7 when it made everything lost again.
func (a *agentDriver) verify(t *testing.T) (checked, lost, remade int) {
	t.Helper()
	code, stdout, stderr := a.run(t, "verify")
	if code != 0 && code != 7 {
		t.Fatalf("agent verify: exit %d\n%s\n%s", code, stdout, stderr)
	}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var c agent.Check
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("agent verify printed %q: %v", sc.Text(), err)
		}
		checked++
		if c.Record != agent.RecordPresent {
			lost++
		}
		if c.Remade {
			remade++
		} else if c.Record != agent.RecordPresent {
			t.Errorf("agent verify: %s %s, not made again: %s", c.ActionID, c.Record, sc.Text())
		}
	}
	if (code == 7) != (lost > 0) {
		t.Errorf("agent verify: exit %d with %d actions lost", code, lost)
	}
	return checked, lost, remade
}

// exactlyOnce: every action the agent's journal settled succeeded exists exactly once, in the books and at
// the provider: one intent of its order not failed (captured in full when its capture succeeded), and one
// provider call under each action's key.
func (a *agentDriver) exactlyOnce(t *testing.T, db *pgx.Conn) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	var account string
	if err := db.QueryRow(t.Context(), `SELECT account_id FROM operations WHERE idempotency_key = $1`, a.payments[0].intent.IdempotencyKey).Scan(&account); err != nil {
		t.Fatal(err)
	}
	for _, p := range a.payments {
		if p.intent.State != "succeeded" {
			continue
		}
		if n := count(t, db, `SELECT count(*) FROM payment_intents WHERE order_id = $1 AND status <> 'failed'`, p.order); n != 1 {
			t.Errorf("agent payment %s: %d intents not failed; want 1", p.order, n)
		}
		switch p.capture.State {
		case "succeeded":
			if n := count(t, db, `SELECT count(*) FROM payment_intents WHERE order_id = $1 AND status = 'succeeded' AND captured_minor = $2`,
				p.order, p.amountMinor); n != 1 {
				t.Errorf("agent payment %s: its capture succeeded, but no intent is captured in full", p.order)
			}
		case "":
		default:
			// Whatever the agent settled it as, the books equal the provider's (booksEqualProvider).
			t.Logf("agent payment %s: its capture settled %s (%s, next step %s)", p.order, p.capture.State, p.capture.Code, p.capture.NextStep)
		}
		for _, r := range []agent.Result{p.intent, p.capture} {
			if r.State != "succeeded" {
				continue
			}
			look, err := a.s.provider.Lookup(t.Context(), payments.DownstreamKey(opstatus.Operation{AccountID: account, IdempotencyKey: r.IdempotencyKey}))
			if err != nil {
				t.Fatal(err)
			}
			if len(look.Effects) != 1 {
				t.Errorf("agent action %s (key %s): %d provider effects; want 1", r.ActionID, r.IdempotencyKey, len(look.Effects))
			}
		}
	}
}

// providerCalls counts the agent's intents and captures that reached the provider (a call under the action's
// key), whatever the journal settled them as: with the driver's payments, what the provider's counters must show.
func (a *agentDriver) providerCalls(t *testing.T, account string) (authorize, capture int64) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.payments {
		for _, r := range []agent.Result{p.intent, p.capture} {
			if r.IdempotencyKey == "" {
				continue
			}
			look, err := a.s.provider.Lookup(t.Context(), payments.DownstreamKey(opstatus.Operation{AccountID: account, IdempotencyKey: r.IdempotencyKey}))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case !look.Found:
			case r.Tool == "create_payment_intent":
				authorize++
			default:
				capture++
			}
		}
	}
	return authorize, capture
}
