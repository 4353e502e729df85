package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/services/provider"
)

// agentWorld is the three services run by the real program (run, in this process) on a test schema, the
// payment provider sandbox as its own process, and the built binary that the agent processes run.
type agentWorld struct {
	bin      string
	db       *testdb.DB
	env      map[string]string // what an agent process gets
	provider *provider.Client
}

func startAgentWorld(t *testing.T) *agentWorld {
	t.Helper()
	bin := proctest.Build(t)
	prov := proctest.Start(t, bin, []string{"provider"}, map[string]string{"PROVIDER_FAULT_INJECTION": "true"}, "PROVIDER_ADDR")
	db := testdb.Schema(t)
	secret := "sk_test_" + strings.ReplaceAll(t.Name(), "/", "_")
	ta, pa, da := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "all"}, env(map[string]string{
			"DATABASE_URL": db.DSN, "DB_MAX_CONNS": "6", "LOG_LEVEL": "warn",
			"TICKETS_ADDR": ta, "PAYMENTS_ADDR": pa, "DEPLOYS_ADDR": da,
			"PROVIDER_URL": prov.URL, "PROVIDER_SECRET": secret, "PROVIDER_TIMEOUT": "1s", "OPERATION_LEASE": "3s",
			"RECOVERY_INTERVAL": "200ms", "DEPLOY_STEPS": "1", "DEPLOY_STEP_DURATION": "100ms", "DEPLOY_POLL_INTERVAL": "100ms",
		}), &syncWriter{w: &out})
	}()
	for _, addr := range []string{ta, pa, da} {
		waitHealthy(t, "http://"+addr+"/readyz", done)
	}
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return &agentWorld{
		bin: bin, db: db, provider: provider.NewClient(prov.URL, secret, 5*time.Second),
		env: map[string]string{
			"TICKETS_URL": "http://" + ta, "PAYMENTS_URL": "http://" + pa, "DEPLOYS_URL": "http://" + da,
			"AGENT_API_KEY": servicetest.AgentSecret, "AGENT_MAX_WAIT": "60s", "AGENT_LOCK_WAIT": "60s",
		},
	}
}

func (w *agentWorld) command(extra map[string]string, args ...string) *exec.Cmd {
	cmd := exec.Command(w.bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range w.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range extra {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

// agentExit is one finished agent process.
type agentExit struct {
	code           int
	stdout, stderr string
}

func (e agentExit) result(t *testing.T) agent.Result {
	t.Helper()
	var r agent.Result
	if err := json.Unmarshal([]byte(e.stdout), &r); err != nil {
		t.Fatalf("agent stdout is not one JSON object: %v\n%s\nstderr: %s", err, e.stdout, e.stderr)
	}
	return r
}

// runAgent runs the agent to its end.
func (w *agentWorld) runAgent(t *testing.T, extra map[string]string, args ...string) agentExit {
	t.Helper()
	cmd := w.command(extra, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("agent %v: %v", args, err)
	}
	return agentExit{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// killAgent starts the agent and SIGKILLs it: at failpoint (which pauses it there) or, with failpoint empty,
// after a random delay, wherever it is by then (perhaps already finished).
func (w *agentWorld) killAgent(t *testing.T, failpoint string, delay time.Duration, args ...string) {
	t.Helper()
	extra := map[string]string{}
	if failpoint != "" {
		extra["RETRYSAFE_AGENT_FAILPOINTS"] = "agent." + failpoint + "=pause"
	}
	cmd := w.command(extra, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reached := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if failpoint != "" && strings.Contains(sc.Text(), "failpoint agent."+failpoint+" reached") {
				close(reached)
				for sc.Scan() {
				}
				return
			}
		}
	}()
	if failpoint != "" {
		select {
		case <-reached:
		case <-time.After(30 * time.Second):
			t.Errorf("agent %v never reached failpoint %s", args, failpoint)
		}
	} else {
		time.Sleep(delay)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// settledHonestly: succeeded, or failed because the service says so (the provider call never left it).
func settledHonestly(r agent.Result) bool {
	return r.State == agent.StateSucceeded || r.State == agent.StateFailed && r.Code == "provider_unavailable"
}

// crashAction is one intended action of the crash test.
type crashAction struct {
	id, tool, args string
	lane           int
	ticketTitle    string
	orderID        string
}

// TestAgentCrashAnywhere runs 200 `retrysafe agent do` processes against the real services, each SIGKILLed at
// one of the four named points (before the journal write, after it and before the send, after the send and
// before the answer, after the answer and before the journal records it) or at a random moment; then `resume`,
// then `do` again with every action id. Tickets carry no source_event_id (a duplicate would be a second row) and
// the provider drops answers of authorizations. Exactly one effect per action, every operation ended, every
// journal verifies, no secret in any journal.
func TestAgentCrashAnywhere(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 400 processes")
	}
	t.Parallel()
	w := startAgentWorld(t)
	const actions, lanes = 200, 4
	// The first authorizations lose their answers: the provider authorizes and drops the connection.
	if err := w.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindAuthorize, Mode: provider.FaultDrop, Count: 12}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	journal := func(lane int) string { return filepath.Join(dir, fmt.Sprintf("lane-%d.journal", lane)) }
	var all []crashAction
	for i := range actions {
		a := crashAction{id: fmt.Sprintf("act-%03d", i), lane: i % lanes}
		if i%4 == 3 {
			a.tool, a.orderID = "create_payment_intent", fmt.Sprintf("order-%03d", i)
			a.args = fmt.Sprintf(`{"order_id":%q,"amount_minor":%d,"currency":"USD"}`, a.orderID, 1000+i)
		} else {
			a.tool, a.ticketTitle = "create_ticket", fmt.Sprintf("crash ticket %03d", i)
			a.args = fmt.Sprintf(`{"project":"crash","title":%q}`, a.ticketTitle)
		}
		all = append(all, a)
	}
	points := []string{"before_journal", "before_send", "after_send", "after_answer", ""}
	byLane := func(do func(a crashAction, n int)) {
		var wg sync.WaitGroup
		for lane := range lanes {
			wg.Go(func() {
				n := 0
				for _, a := range all {
					if a.lane == lane {
						do(a, n)
						n++
					}
				}
			})
		}
		wg.Wait()
	}

	// 1. Every first `do` is killed.
	byLane(func(a crashAction, n int) {
		point := points[(n+a.lane)%len(points)]
		w.killAgent(t, point, time.Duration(rand.IntN(80))*time.Millisecond,
			"agent", "do", "--journal", journal(a.lane), "--action", a.id, a.tool, a.args)
	})

	// 2. resume settles what the killed processes left.
	var wg sync.WaitGroup
	var resumedMu sync.Mutex
	resumed := 0
	for lane := range lanes {
		wg.Go(func() {
			res := w.runAgent(t, nil, "agent", "resume", "--journal", journal(lane))
			resumedMu.Lock()
			resumed += strings.Count(res.stdout, "\n")
			resumedMu.Unlock()
			if res.code != 0 {
				t.Errorf("resume lane %d: exit %d\n%s\n%s", lane, res.code, res.stdout, res.stderr)
			}
			for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
				if line == "" {
					continue
				}
				var r agent.Result
				if err := json.Unmarshal([]byte(line), &r); err != nil || !settledHonestly(r) {
					t.Errorf("resume lane %d settled %s (%v); want succeeded, or failed with provider_unavailable", lane, line, err)
				}
			}
		})
	}
	wg.Wait()

	// Operations the journal held after the crash keep their identity through the second `do`.
	before := map[string]string{}
	for lane := range lanes {
		j, err := agent.ReadJournal(journal(lane))
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range j.Operations() {
			before[op.ActionID] = op.OperationID
		}
	}

	// 3. `do` again with every action id: each ends as it settled, as the same operation when it was journaled.
	// An action the service says did not happen (the killed agent's disconnect cancelled the provider call before
	// it left: 502 provider_unavailable) is tried again the way its next step says: a new action id that
	// supersedes it.
	var retriedMu sync.Mutex
	retried := 0
	byLane(func(a crashAction, _ int) {
		res := w.runAgent(t, nil, "agent", "do", "--journal", journal(a.lane), "--action", a.id, a.tool, a.args)
		r := res.result(t)
		if (res.code != 0 && res.code != 5) || !settledHonestly(r) || (before[a.id] != "" && r.OperationID != before[a.id]) {
			t.Errorf("do %s again: exit %d, %s %s; want succeeded (or failed, provider_unavailable) as operation %q\n%s",
				a.id, res.code, r.State, r.OperationID, before[a.id], res.stderr)
			return
		}
		if res.code == 5 {
			retriedMu.Lock()
			retried++
			retriedMu.Unlock()
			again := w.runAgent(t, nil, "agent", "do", "--journal", journal(a.lane), "--action", a.id+"-again", "--supersedes", a.id, a.tool, a.args)
			if again.code != 0 {
				t.Errorf("do %s-again: exit %d\n%s\n%s", a.id, again.code, again.stdout, again.stderr)
			}
		}
	})

	// Exactly one effect per action.
	var rows []struct {
		Title string
		N     int
	}
	if err := w.db.Raw(`SELECT title, count(*) AS n FROM tickets WHERE project = 'crash' GROUP BY title`).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	tickets := map[string]int{}
	for _, r := range rows {
		tickets[r.Title] = r.N
	}
	var intents []struct {
		OrderID string
		N       int
	}
	if err := w.db.Raw(`SELECT order_id, count(*) AS n FROM payment_intents WHERE status <> 'failed' GROUP BY order_id`).Scan(&intents).Error; err != nil {
		t.Fatal(err)
	}
	orders := map[string]int{}
	for _, r := range intents {
		orders[r.OrderID] = r.N
	}
	payments := 0
	for _, a := range all {
		switch {
		case a.ticketTitle != "" && tickets[a.ticketTitle] != 1:
			t.Errorf("%s: %d tickets titled %q; want exactly 1", a.id, tickets[a.ticketTitle], a.ticketTitle)
		case a.orderID != "":
			payments++
			if orders[a.orderID] != 1 {
				t.Errorf("%s: %d payment intents for %s; want exactly 1", a.id, orders[a.orderID], a.orderID)
			}
		}
	}
	if len(tickets) != actions-payments {
		t.Errorf("%d distinct crash tickets; want %d", len(tickets), actions-payments)
	}
	counters, err := w.provider.Counters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if counters["authorize"] != int64(payments) {
		t.Errorf("the provider authorized %d times for %d payment actions", counters["authorize"], payments)
	}

	// Every operation ended; every journal verifies and holds no secret.
	interrupted, lookups, unknown := 0, 0, 0
	for lane := range lanes {
		j, err := agent.ReadJournal(journal(lane))
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range j.Operations() {
			if !op.Final() || !settledHonestly(j.Result(op)) {
				t.Errorf("lane %d: %s (%s) ended %s", lane, op.OperationID, op.ActionID, op.State())
			}
			for _, at := range op.Attempts {
				if at.Finished != nil && at.Finished.Status == http.StatusAccepted {
					unknown++
				}
			}
			for _, ob := range op.Observations {
				switch ob.Kind {
				case agent.ObsInterrupted:
					interrupted++
				case agent.ObsLookup:
					lookups++
				}
			}
		}
		rep, err := agent.VerifyJournal(journal(lane))
		if err != nil || !rep.Intact() {
			t.Errorf("lane %d journal: %v %+v", lane, err, rep.Problems)
		}
		raw, _ := os.ReadFile(journal(lane))
		if bytes.Contains(raw, []byte(servicetest.AgentSecret)) {
			t.Errorf("lane %d journal holds the API key", lane)
		}
	}
	if res := w.runAgent(t, nil, "audit", "verify", "--journal", journal(0)); res.code != 0 || !strings.Contains(res.stdout, "INTACT") {
		t.Errorf("audit verify --journal: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// The provider's lost answers happened (the payments service recorded each as sent, no response).
	var dropped int
	if err := w.db.Raw(`SELECT count(*) FROM operation_events WHERE type = 'dispatch_sent_no_response'`).Scan(&dropped).Error; err != nil {
		t.Fatal(err)
	}
	if dropped != 12 {
		t.Errorf("the payments service saw %d lost provider answers; want the 12 the provider dropped", dropped)
	}
	// The kills left work for resume, and it went through the evidence: interrupted attempts, then lookups.
	if resumed == 0 || interrupted == 0 || lookups == 0 {
		t.Errorf("resume settled %d operations, %d interrupted attempts, %d lookups; the kills left nothing to recover", resumed, interrupted, lookups)
	}
	t.Logf("%d killed agents; resume settled %d operations (%d interrupted attempts, %d lookups); %d lost provider answers, "+
		"%d answers 202 unknown to the agent; %d actions the service said never happened, done again under a superseding "+
		"action id; %d tickets, %d intents, provider %v",
		actions, resumed, interrupted, lookups, dropped, unknown, retried, len(tickets), len(orders), counters)
}

func ticketCount(t *testing.T, w *agentWorld, title string) int {
	t.Helper()
	var n int
	if err := w.db.Raw(`SELECT count(*) FROM tickets WHERE title = ?`, title).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTwoAgentsOneJournal: agents sharing a journal take turns (the journal is locked for a process's whole
// run), so neither corrupts it nor doubles an effect; one that may not wait is refused clearly.
func TestTwoAgentsOneJournal(t *testing.T) {
	t.Parallel()
	w := startAgentWorld(t)
	path := filepath.Join(t.TempDir(), "shared.journal")
	do := func(action, title string, extra map[string]string) agentExit {
		return w.runAgent(t, extra, "agent", "do", "--journal", path, "--action", action, "create_ticket",
			fmt.Sprintf(`{"project":"two","title":%q}`, title))
	}

	// The same action from two agents at once: one operation, one ticket.
	var wg sync.WaitGroup
	res := make([]agentExit, 4)
	for i := range 4 {
		wg.Go(func() {
			if i < 2 {
				res[i] = do("same", "same ticket", nil)
			} else {
				res[i] = do(fmt.Sprintf("other-%d", i), fmt.Sprintf("other ticket %d", i), nil)
			}
		})
	}
	wg.Wait()
	for i, r := range res {
		if r.code != 0 {
			t.Fatalf("agent %d: exit %d\n%s%s", i, r.code, r.stdout, r.stderr)
		}
	}
	if a, b := res[0].result(t), res[1].result(t); a.OperationID != b.OperationID {
		t.Errorf("one action, two operations: %s and %s", a.OperationID, b.OperationID)
	}
	for title, want := range map[string]int{"same ticket": 1, "other ticket 2": 1, "other ticket 3": 1} {
		if got := ticketCount(t, w, title); got != want {
			t.Errorf("%d tickets %q; want %d", got, title, want)
		}
	}

	// An agent that may not wait while another holds the journal is refused, and nothing is sent.
	holder := w.command(map[string]string{"RETRYSAFE_AGENT_FAILPOINTS": "agent.before_send=pause"},
		"agent", "do", "--journal", path, "--action", "held", "create_ticket", `{"project":"two","title":"held ticket"}`)
	stderr, _ := holder.StderrPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.Contains(sc.Text(), "failpoint agent.before_send reached") {
	}
	refused := do("refused", "refused ticket", map[string]string{"AGENT_LOCK_WAIT": "0s"})
	if refused.code != 1 || !strings.Contains(refused.stderr, "in use by another agent") {
		t.Errorf("second agent while the journal is held: exit %d, stderr %q; want 1 and a clear refusal", refused.code, refused.stderr)
	}
	if n := ticketCount(t, w, "refused ticket"); n != 0 {
		t.Errorf("the refused agent created %d tickets", n)
	}
	_ = holder.Process.Signal(syscall.SIGKILL)
	_ = holder.Wait()

	if r := w.runAgent(t, nil, "agent", "resume", "--journal", path); r.code != 0 {
		t.Fatalf("resume: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := ticketCount(t, w, "held ticket"); n != 1 {
		t.Errorf("%d held tickets after resume; want 1", n)
	}
	rep, err := agent.VerifyJournal(path)
	if err != nil || !rep.Intact() {
		t.Errorf("shared journal: %v %+v", err, rep.Problems)
	}
}

// TestAgentCommandExitCodes: the do contract from a shell's point of view.
func TestAgentCommandExitCodes(t *testing.T) {
	t.Parallel()
	w := startAgentWorld(t)
	path := filepath.Join(t.TempDir(), "codes.journal")
	do := func(action, tool, args string) agentExit {
		return w.runAgent(t, nil, "agent", "do", "--journal", path, "--action", action, tool, args)
	}
	ok := do("t", "create_ticket", `{"project":"codes","title":"exit codes"}`)
	if ok.code != 0 || ok.result(t).State != agent.StateSucceeded || ok.result(t).HTTPStatus != 201 {
		t.Fatalf("do: exit %d %s%s", ok.code, ok.stdout, ok.stderr)
	}
	// The same intent spelled differently is the same action; a changed one is refused before any send.
	if again := do("t", "create_ticket", `{ "title": "exit codes", "project": "codes" }`); again.code != 0 ||
		again.result(t).OperationID != ok.result(t).OperationID {
		t.Errorf("same intent again: exit %d %s", again.code, again.stdout)
	}
	changed := do("t", "create_ticket", `{"project":"codes","title":"exit codes, changed"}`)
	if changed.code != 4 || changed.result(t).Code != "changed_intent" || ticketCount(t, w, "exit codes, changed") != 0 {
		t.Errorf("changed intent: exit %d %s; want 4, changed_intent, nothing sent", changed.code, changed.stdout)
	}
	if n := ticketCount(t, w, "exit codes"); n != 1 {
		t.Errorf("%d tickets; want 1", n)
	}
	// A changed intent is a new action that supersedes the old one: the server links the two operations.
	sup := w.runAgent(t, nil, "agent", "do", "--journal", path, "--action", "t2", "--supersedes", "t", "create_ticket",
		`{"project":"codes","title":"exit codes, changed"}`)
	if sup.code != 0 {
		t.Fatalf("superseding action: exit %d %s%s", sup.code, sup.stdout, sup.stderr)
	}
	var links int
	w.db.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = 'superseded'`, ok.result(t).ServerOperationID).Scan(&links)
	if links != 1 {
		t.Errorf("the superseded operation has %d superseded events; want 1", links)
	}
	if r := do("bad", "create_ticket", `{"project":"codes","title":""}`); r.code != 4 || r.result(t).Code != "validation_failed" {
		t.Errorf("invalid ticket: exit %d %s; want 4 validation_failed", r.code, r.stdout)
	}
	if r := do("nope", "no_such_tool", `{}`); r.code != 1 {
		t.Errorf("unknown tool: exit %d; want 1", r.code)
	}
	pi := do("pi", "create_payment_intent", `{"order_id":"codes-1","amount":"2000.00","currency":"USD"}`).result(t)
	var intent struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(pi.Body, &intent)
	capture := fmt.Sprintf(`{"intent_id":%q}`, intent.ID)
	if r := do("cap", "capture_payment", capture); r.code != 3 || r.result(t).Code != "approval_required" {
		t.Fatalf("capture above the threshold: exit %d %s; want 3 approval_required", r.code, r.stdout)
	}
	// The next step: request the approval, a person approves it, the same action again with approval_id.
	ap := do("cap-approval", "request_approval", `{"for_action":"cap"}`)
	approval := ap.result(t).ApprovalID
	if ap.code != 0 || approval == "" {
		t.Fatalf("request_approval: exit %d %s%s", ap.code, ap.stdout, ap.stderr)
	}
	req, _ := http.NewRequest(http.MethodPost, w.env["PAYMENTS_URL"]+"/v1/approvals/"+approval+"/approve", nil)
	req.Header.Set("Authorization", "Bearer "+servicetest.ApproverSecret)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("approve: %v %v", resp, err)
	}
	withApproval := fmt.Sprintf(`{"intent_id":%q,"approval_id":%q}`, intent.ID, approval)
	if r := do("cap", "capture_payment", withApproval); r.code != 0 || r.result(t).HTTPStatus != http.StatusOK {
		t.Errorf("capture with the approval: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
	if counters, _ := w.provider.Counters(t.Context()); counters["capture"] != 1 {
		t.Errorf("the provider captured %d times; want 1", counters["capture"])
	}
	show := w.runAgent(t, nil, "agent", "show", "--journal", path, "t")
	if show.code != 0 || !strings.Contains(show.stdout, "changed_intent_refused") || !strings.Contains(show.stdout, "attempt 1") {
		t.Errorf("show: exit %d\n%s", show.code, show.stdout)
	}
}

// fakeServices answers every agent request with answer and counts them: for what `retrysafe agent` decides
// before or without the real services.
func fakeServices(t *testing.T, answer string, status int) (url string, requests *atomic.Int32) {
	t.Helper()
	requests = &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(answer))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, requests
}

// TestAgentCommandRefusesAnotherKeysJournal: do and resume under a key other than the one the journal's
// operations were made with exit 1 (usage), send nothing and write nothing; --same-account adopts the new key.
// A file that is not a journal is refused the same way and left alone; oversized arguments are refused before
// anything is sent.
func TestAgentCommandRefusesAnotherKeysJournal(t *testing.T) {
	t.Parallel()
	url, requests := fakeServices(t, `{"id":"tkt_1","operation_id":"op_1"}`, http.StatusCreated)
	dir := t.TempDir()
	path := filepath.Join(dir, "keyed.journal")
	vars := func(key string, more ...string) func(string) string {
		m := map[string]string{"TICKETS_URL": url, "AGENT_API_KEY": key, "AGENT_LOCK_WAIT": "0s"}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return env(m)
	}
	ticket := []string{"create_ticket", `{"project":"ops","title":"keyed"}`}
	var out bytes.Buffer
	if err := run(t.Context(), append([]string{"agent", "do", "--journal", path, "--action", "t"}, ticket...), vars("key-of-b"), &out); err != nil {
		t.Fatalf("do under the journal's key: %v", err)
	}
	before, _ := os.ReadFile(path)
	for _, args := range [][]string{
		{"agent", "resume", "--journal", path},
		append([]string{"agent", "do", "--journal", path, "--action", "t"}, ticket...),
		append([]string{"agent", "do", "--journal", path, "--action", "new"}, ticket...),
	} {
		out.Reset()
		err := run(t.Context(), args, vars("key-of-a"), &out)
		if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "--same-account") || out.Len() != 0 {
			t.Errorf("%v under another key: exit %d, %v, stdout %q; want 1, naming --same-account, nothing printed", args[:2], exitCode(err), err, out.String())
		}
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) || requests.Load() != 1 {
		t.Errorf("under another key: the journal changed (%v), %d requests; want neither beyond the first", !bytes.Equal(after, before), requests.Load())
	}
	if err := run(t.Context(), []string{"agent", "resume", "--journal", path, "--same-account"}, vars("key-of-a"), &out); err != nil {
		t.Errorf("resume --same-account: %v", err)
	}

	precious := filepath.Join(dir, "precious")
	os.WriteFile(precious, []byte("PRECIOUS"), 0o600)
	err := run(t.Context(), append([]string{"agent", "do", "--journal", precious, "--action", "p"}, ticket...), vars("key-of-a"), &out)
	if got, _ := os.ReadFile(precious); err == nil || exitCode(err) != 1 || string(got) != "PRECIOUS" {
		t.Errorf("do --journal on a file that is not a journal: exit %d (%v), the file now %q; want 1 and the file unchanged", exitCode(err), err, got)
	}

	big := fmt.Sprintf(`{"project":"ops","title":%q}`, strings.Repeat("x", 2000))
	err = run(t.Context(), []string{"agent", "do", "--journal", filepath.Join(dir, "big.journal"), "--action", "big", "create_ticket", big},
		vars("key-of-a", "AGENT_MAX_BODY_BYTES", "1024"), &out)
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "at most 1024") || requests.Load() != 1 {
		t.Errorf("arguments over AGENT_MAX_BODY_BYTES: exit %d, %v, %d requests; want 1, naming the limit, nothing sent", exitCode(err), err, requests.Load())
	}
}

// terminalHostile is what a model or a service might send to take over a terminal: OSC 52 (write the
// clipboard), a title change ended by BEL, CSI erase, a C1 CSI, DEL, a right-to-left override, a forged line.
const terminalHostile = "\x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x07\x1b[2J\u009b31m\x7f\u202eevil\u2066\r\nretrysafe: done"

func checkTerminalSafe(t *testing.T, what, s string) {
	t.Helper()
	for _, r := range s {
		if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r)) {
			t.Errorf("%s carries %U raw:\n%s", what, r, s)
			return
		}
	}
}

// TestAgentCommandEscapesWhatOthersSupplied: agent do's JSON and error, and agent show's summary and
// timeline, carry a model's action id and arguments and a service's problem code and operation id escaped;
// the JSON still decodes to the service's exact code.
func TestAgentCommandEscapesWhatOthersSupplied(t *testing.T) {
	t.Parallel()
	code, _ := json.Marshal(terminalHostile)
	url, _ := fakeServices(t, `{"type":"about:blank","status":400,"code":`+string(code)+`,"operation_id":`+string(code)+`}`, http.StatusBadRequest)
	path := filepath.Join(t.TempDir(), "hostile.journal")
	vars := env(map[string]string{"TICKETS_URL": url, "AGENT_API_KEY": "k"})
	args, _ := json.Marshal(map[string]string{"project": "ops", "title": terminalHostile})
	action := "act" + terminalHostile
	var out bytes.Buffer
	err := run(t.Context(), []string{"agent", "do", "--journal", path, "--action", action, "create_ticket", string(args)}, vars, &out)
	if exitCode(err) != exitRefused {
		t.Fatalf("do: exit %d, %v; want %d (refused)", exitCode(err), err, exitRefused)
	}
	checkTerminalSafe(t, "do's error", err.Error())
	checkTerminalSafe(t, "do's JSON", out.String())
	var res agent.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Code != terminalHostile || res.ActionID != action {
		t.Errorf("do's JSON = %q (%v); want the service's code and the action id, exactly", out.String(), err)
	}
	for _, show := range [][]string{{"agent", "show", "--journal", path}, {"agent", "show", "--journal", path, action}} {
		out.Reset()
		if err := run(t.Context(), show, vars, &out); err != nil {
			t.Fatalf("%v: %v", show[:2], err)
		}
		checkTerminalSafe(t, "agent show", out.String())
		if !strings.Contains(out.String(), `\x1b]52;c;`) {
			t.Errorf("agent show does not show the hostile text escaped:\n%s", out.String())
		}
	}
}
