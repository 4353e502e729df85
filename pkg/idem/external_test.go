package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// fakeEffect is the other side of an external effect, as a struct with function fields.
type fakeEffect struct {
	calls atomic.Int64
	call  func(ctx context.Context, op opstatus.Operation) (string, error)
	// prepare, when set, runs in the claim's transaction (to make the claim wait on a lock).
	prepare func(ctx context.Context, tx *gorm.DB) error
}

type chargeCommand struct {
	Amount int64 `json:"amount"`
}

func (c *chargeCommand) Validate() error {
	if c.Amount <= 0 {
		return problem.Validation(problem.FieldError{Field: "amount", Message: "must be positive"})
	}
	return nil
}

type externalEnv struct {
	env    *servicetest.Env
	effect *fakeEffect
	url    string
	// requests holds each request's context by Idempotency-Key, so a test can see the server notice a caller
	// that hung up.
	requests *sync.Map
}

func setupExternal(t *testing.T, lease time.Duration, opts ...servicetest.Option) *externalEnv {
	t.Helper()
	env := servicetest.New(t, opts...)
	env.Idem.Lease = lease
	fx := &fakeEffect{call: func(context.Context, opstatus.Operation) (string, error) { return "charged", nil }}
	record := func(_ context.Context, _ *gorm.DB, op opstatus.Operation, outcome string, err error) (idem.Result, error) {
		if err != nil {
			return idem.ProblemResult(err, opstatus.StateFailed), nil
		}
		return idem.Result{Status: 200, Body: map[string]any{"operation": op.ID, "outcome": outcome}}, nil
	}
	requests := &sync.Map{}
	charges := func(c *gin.Context) {
		requests.Store(c.GetHeader("Idempotency-Key"), c.Request.Context())
		var cmd chargeCommand
		if err := httpjson.DecodeCommand(c.Request, &cmd); err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		idemgin.DoExternal(env.Idem, c, idem.Request{Kind: "test.charge", Command: cmd}, idem.ExternalSteps[string]{
			Prepare: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error {
				if cmd.Amount == 13 {
					return problem.New("invalid_state", "unlucky")
				}
				if fx.prepare != nil {
					return fx.prepare(ctx, tx)
				}
				return nil
			},
			Call: func(ctx context.Context, op opstatus.Operation) (string, error) {
				fx.calls.Add(1)
				return fx.call(ctx, op)
			},
			Record: record,
		})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/charges", charges) }))
	return &externalEnv{env: env, effect: fx, url: env.URL, requests: requests}
}

type reply struct {
	status int
	header http.Header
	body   map[string]any
}

func (e *externalEnv) post(t *testing.T, key, body string, headers ...string) reply {
	t.Helper()
	return postJSON(t, e.url+"/charges", key, body, headers...)
}

// postJSON posts body as the demo agent under key; routes of these tests are not in api/openapi.yaml, so
// answers are not validated against it.
func postJSON(t *testing.T, url, key, body string, headers ...string) reply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+servicetest.AgentSecret)
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("body %s: %v", raw, err)
	}
	return r
}

func TestExternalRunsOnceAndReplays(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 5*time.Second)
	first := e.post(t, "k", `{"amount":5}`)
	again := e.post(t, "k", `{ "amount": 5 }`)
	if first.status != 200 || again.status != 200 || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d, again %d %v", first.status, again.status, again.header)
	}
	if n := e.effect.calls.Load(); n != 1 {
		t.Fatalf("effect ran %d times", n)
	}
	if r := e.post(t, "k", `{"amount":6}`); r.status != 422 || r.body["code"] != "idempotency_key_reused" {
		t.Fatalf("changed amount: %d %v", r.status, r.body)
	}
}

func TestExternalPrepareFailureLeavesKeyFree(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 5*time.Second)
	if r := e.post(t, "k", `{"amount":13}`); r.status != 409 {
		t.Fatalf("prepare failure: %d", r.status)
	}
	var keys int64
	e.env.DB.Raw(`SELECT count(*) FROM operations WHERE key_state IS NOT NULL`).Scan(&keys)
	if keys != 0 || e.effect.calls.Load() != 0 {
		t.Fatalf("keys=%d calls=%d after a refused prepare", keys, e.effect.calls.Load())
	}
}

func TestExternalInProgressAndPreferWait(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 30*time.Second)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		entered <- struct{}{}
		<-release
		return "late", nil
	}
	var wg sync.WaitGroup
	wg.Go(func() { e.post(t, "slow", `{"amount":5}`) })
	<-entered

	busy := e.post(t, "slow", `{"amount":5}`)
	if busy.status != 409 || busy.body["code"] != "request_in_progress" || busy.header.Get("Retry-After") == "" || busy.body["operation_id"] == nil {
		t.Fatalf("in progress: %d %v %v", busy.status, busy.header, busy.body)
	}
	go func() { time.Sleep(300 * time.Millisecond); close(release) }()
	waited := e.post(t, "slow", `{"amount":5}`, "Prefer", "wait=10")
	wg.Wait()
	if waited.status != 200 || waited.body["outcome"] != "late" || waited.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("Prefer: wait got %d %v", waited.status, waited.body)
	}
	if n := e.effect.calls.Load(); n != 1 {
		t.Fatalf("effect ran %d times", n)
	}
}

func TestExternalUnknownOutcomeIsReconciled(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 5*time.Second)
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		return "", fmt.Errorf("connection reset: %w", idem.ErrOutcomeUnknown)
	}
	first := e.post(t, "lost", `{"amount":5}`)
	if first.status != 202 || first.body["state"] != "unknown" || first.header.Get("Operation-Id") == "" || first.body["operation_id"] != first.header.Get("Operation-Id") {
		t.Fatalf("lost answer: %d %v", first.status, first.body)
	}
	// A retry while unknown neither repeats the effect nor pretends to know.
	if r := e.post(t, "lost", `{"amount":5}`); r.status != 202 || r.body["state"] != "unknown" {
		t.Fatalf("retry while unknown: %d %v", r.status, r.body)
	}
	if n := e.effect.calls.Load(); n != 1 {
		t.Fatalf("effect ran %d times", n)
	}

	// The reconciler learns from the other side that it happened.
	worker := &opstatus.RecoveryWorker{DB: e.env.DB.Pool, Logger: e.env.Logger, Reconcilers: map[string]opstatus.Reconciler{
		"test.charge": opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
			return e.env.Idem.Settle(ctx, op, "system:test", func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
				return idem.Result{Status: 200, Body: map[string]any{"operation": op.ID, "outcome": "found at provider"}}, nil
			})
		}),
	}}
	if n, err := worker.RunOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("reconciled %d, %v", n, err)
	}
	settled := e.post(t, "lost", `{"amount":5}`)
	if settled.status != 200 || settled.body["outcome"] != "found at provider" || settled.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after reconcile: %d %v", settled.status, settled.body)
	}
	op, err := opstatus.Get(context.Background(), e.env.DB.Pool, servicetest.AccountDemo, first.header.Get("Operation-Id"))
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range op.Events {
		types = append(types, ev.Type)
	}
	if op.State != opstatus.StateSucceeded || !strings.Contains(strings.Join(types, ","), "outcome_unknown,retried,reconciled,replayed") {
		t.Fatalf("operation %s events %v", op.State, types)
	}
	if n := e.effect.calls.Load(); n != 1 {
		t.Fatalf("effect ran %d times", n)
	}
}

func TestExpiredLeaseBecomesUnknownAndLateAnswerDefers(t *testing.T) {
	t.Parallel()
	// The late answer comes after the lease (the clock moved past it, so the recovery worker may judge the
	// operation) and before the handler's own recording deadline, one more lease later in real time.
	const lease = 30 * time.Second
	e := setupExternal(t, lease)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		entered <- struct{}{}
		<-release
		return "too late", nil
	}
	done := make(chan reply, 1)
	go func() { done <- e.post(t, "hung", `{"amount":5}`) }()
	<-entered
	e.env.Clock.Advance(lease + time.Second) // past the lease

	settledBy := "reconciler"
	worker := &opstatus.RecoveryWorker{DB: e.env.DB.Pool, Logger: e.env.Logger, Clock: e.env.Clock, Reconcilers: map[string]opstatus.Reconciler{
		"test.charge": opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
			return e.env.Idem.Settle(ctx, op, "system:test", func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
				return idem.Result{Status: 200, Body: map[string]any{"operation": op.ID, "outcome": settledBy}}, nil
			})
		}),
	}}
	if n, err := worker.RunOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("reconciled %d, %v", n, err)
	}
	close(release)
	late := <-done
	// The handler's own record lost the race: it answers with what the reconciler stored, never a second result.
	if late.status != 200 || late.body["outcome"] != settledBy {
		t.Fatalf("late answer: %d %v", late.status, late.body)
	}
	var completed int64
	e.env.DB.Raw(`SELECT count(*) FROM operation_events WHERE type IN ('completed', 'reconciled')`).Scan(&completed)
	if completed != 1 {
		t.Fatalf("%d outcome events, want exactly 1", completed)
	}
}

// TestRetryOfUnknownSettlesAtOnce: with the kind's reconciler on the handler, a retry after a lost answer asks
// the other side right away and gets the settled result, without waiting for the recovery worker.
func TestRetryOfUnknownSettlesAtOnce(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 5*time.Second)
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		return "", fmt.Errorf("read: connection reset: %w", idem.ErrOutcomeUnknown)
	}
	var asked atomic.Int64
	e.env.Idem.Reconcilers = map[string]opstatus.Reconciler{
		"test.charge": opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
			asked.Add(1)
			return e.env.Idem.Settle(ctx, op, "system:test", func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
				return idem.Result{Status: 200, Body: map[string]any{"operation": op.ID, "outcome": "found at provider"}}, nil
			})
		}),
	}
	if first := e.post(t, "lost", `{"amount":5}`); first.status != 202 {
		t.Fatalf("lost answer: %d %v", first.status, first.body)
	}
	retry := e.post(t, "lost", `{"amount":5}`)
	if retry.status != 200 || retry.body["outcome"] != "found at provider" || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v", retry.status, retry.body)
	}
	if asked.Load() != 1 || e.effect.calls.Load() != 1 {
		t.Fatalf("reconciler asked %d times, effect ran %d times", asked.Load(), e.effect.calls.Load())
	}
}

// TestAttemptOutlivingItsLeaseIsNumberedOnce: the recovery worker gives the attempt that claimed an operation
// its attempt record (outcome unknown) when the lease runs out before any outcome; if that attempt's process
// was only slow and records its result afterwards, the result does not number the attempt a second time.
func TestAttemptOutlivingItsLeaseIsNumberedOnce(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	e := setupExternal(t, lease)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		entered <- struct{}{}
		<-release
		return "late but done", nil
	}
	done := make(chan reply, 1)
	go func() { done <- e.post(t, "slow", `{"amount":5}`, "Attempt-Id", "att-slow") }()
	<-entered
	e.env.Clock.Advance(lease + time.Second) // past the lease
	if _, err := (&opstatus.RecoveryWorker{DB: e.env.DB.Pool, Clock: e.env.Clock}).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ops []opstatus.Operation
	e.env.DB.Raw(`SELECT id FROM operations WHERE idempotency_key = 'slow' AND state = 'unknown'`).Scan(&ops)
	if len(ops) != 1 {
		t.Fatalf("expired %d leases", len(ops))
	}
	close(release)
	if late := <-done; late.status != 200 || late.body["outcome"] != "late but done" {
		t.Fatalf("late answer: %d %v", late.status, late.body)
	}
	var recs []struct {
		Type    string
		Attempt *int64
		Outcome *string
	}
	e.env.DB.Raw(`SELECT type, attempt, detail->>'outcome' AS outcome FROM operation_events_numbered
WHERE operation_id = ? AND detail->>'attempt_id' = 'att-slow' ORDER BY id`, ops[0].ID).Scan(&recs)
	var got []string
	for _, r := range recs {
		n, o := "-", "-"
		if r.Attempt != nil {
			n = fmt.Sprint(*r.Attempt)
		}
		if r.Outcome != nil {
			o = *r.Outcome
		}
		got = append(got, r.Type+" "+n+" "+o)
	}
	if want := "[claimed - - lease_expired 1 unknown completed - -]"; fmt.Sprint(got) != want {
		t.Fatalf("records of the attempt: %v; want %s", got, want)
	}
	rep, err := audit.Verify(context.Background(), e.env.DB.Pool, audit.VerifyOptions{OperationID: ops[0].ID})
	if err != nil || !rep.Intact() {
		t.Fatalf("chain: %v %+v", err, rep.Problems)
	}
}
