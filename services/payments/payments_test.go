package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// TestPayments starts one real provider process (`retrysafe provider` with fault injection) for the package's
// tests, which run as parallel subtests against it. Each subtest is its own merchant (its own bearer secret),
// so provider counters and faults never leak between tests.
func TestPayments(t *testing.T) {
	bin := proctest.Build(t)
	prov := proctest.Start(t, bin, []string{"provider"}, map[string]string{"PROVIDER_FAULT_INJECTION": "true"}, "PROVIDER_ADDR")
	h := &harness{bin: bin, providerURL: prov.URL}
	tests := []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"LostCaptureAnswerSettlesIntoOneCapture", testLostCaptureAnswer},
		{"AnsweredFailureSettlesOnTheFirstRetry", testAnsweredFailureSettles},
		{"ConcurrentCapturesOneKey", testConcurrentCapturesOneKey},
		{"ConcurrentCapturesDifferentKeys", testConcurrentCapturesDifferentKeys},
		{"CrashBeforeProviderCall", func(t *testing.T, h *harness) { testCrash(t, h, "idem.external.before_call") }},
		{"CrashAfterProviderCall", func(t *testing.T, h *harness) { testCrash(t, h, "idem.external.after_call") }},
		{"ClaimOfAKilledReplicaReleasedAtOnce", testOwnerGone},
		{"OwnerThatLostItsLockSendsNothing", testOwnerLostItsLock},
		{"AmountSpellingsAreOneRequest", testAmountSpellings},
		{"ConcurrentRefundsNeverExceedCaptured", testConcurrentRefunds},
		{"RacingIntentsForOneOrder", testRacingIntents},
		{"AmountValidation", testAmountValidation},
		{"ApprovalAboveThreshold", testApproval},
		{"CancelAndScope", testCancelAndScope},
		{"RefundRecordLostWhileDatabaseDown", testRefundRecordLost},
		{"CallerHangsUpDuringClaim", testCallerHangsUpDuringClaim},
		{"UnsentWhenLeaseSpentAtCommit", testUnsentWhenLeaseSpentAtCommit},
		{"FrozenDatabaseBeforeEffect", testFrozenDatabaseBeforeEffect},
		{"UnreachableProviderIsNotSent", testUnreachableProviderIsNotSent},
		{"DuplicateEffectConfirmed", testDuplicateEffect},
		{"DuplicatedRefundBookedNotRefunded", testRemediation},
		{"CaptureDuplicateCorrected", testCaptureDuplicateCorrected},
		{"CaptureCorrectedUntilReturned", testCaptureCorrectedUntilReturned},
		{"ProviderSaysItReplayed", testProviderSaysItReplayed},
		{"StrictJSON", testStrictJSON},
		{"ApprovalsFailClosed", testApprovalsFailClosed},
		{"ConcurrentSmallRefundsNeedApproval", testConcurrentSmallRefunds},
		{"ClaimsLostWithTheDatabase", testClaimsLostWithTheDatabase},
		{"OperationKeyStillReconciles", testOperationKeyStillReconciles},
		{"PersonDecidesUnknownCapture", testResolveUnknownCapture},
		{"DecisionWaitsForTheCall", testDecisionWaitsForTheCall},
		{"DecisionSentToAnotherService", testDecisionSentToAnotherService},
		{"DecisionWhenTheProviderKnows", testDecisionWhenTheProviderKnows},
		{"PrunedKeysNeverRunTwice", testPrunedKeysNeverRunTwice},
		{"KeyReusedAfterLifetime", testKeyReusedAfterLifetime},
		{"SupersedeUnknownWithApproval", testSupersedeUnknownWithApproval},
		{"RetryOfRunningCapture", testRetryOfRunningCapture},
		{"HeadersThatCannotApply", testHeadersThatCannotApply},
		{"SweepRestoresLostRows", testSweepRestoresLostRows},
		{"SweepLeavesATakenOrderToAPerson", testSweepLeavesATakenOrderToAPerson},
		{"RetryAdoptsWhatTheSweepRestored", testRetryAdoptsWhatTheSweepRestored},
		{"GrantsForASession", testGrants},
		{"GrantNeverApprovesARetryAfterUnknown", testGrantNeverApprovesARetryAfterUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, h)
		})
	}
}

type harness struct {
	bin         string
	providerURL string
}

// bundle is one payments service under test, its own provider merchant and the recovery worker of its schema.
type bundle struct {
	agent, approver, other *apitest.Client
	provider               *provider.Client
	db                     *testdb.DB
	recovery               *opstatus.RecoveryWorker
	idem                   *idem.Handler
	env                    *servicetest.Env
	svc                    *payments.Server
}

func merchantSecret(t *testing.T) string { return "sk_test_" + strings.ReplaceAll(t.Name(), "/", "_") }

func (h *harness) setup(t *testing.T) *bundle {
	t.Helper()
	return h.setupWith(t, h.providerURL)
}

// setupWith is setup against the provider at url.
func (h *harness) setupWith(t *testing.T, url string) *bundle {
	t.Helper()
	env := servicetest.New(t)
	client := provider.NewClientHTTP(url, merchantSecret(t), apitest.HTTPClient(t, 2*time.Second))
	svc, err := payments.New(env.Deps, payments.Config{
		Provider: client, ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	agent := env.Serve(t, svc)
	return &bundle{
		agent: agent, approver: agent.As(servicetest.ApproverSecret), other: agent.As(servicetest.OtherAgentSecret),
		provider: client, db: env.DB,
		recovery: &opstatus.RecoveryWorker{DB: env.DB.Pool, Reconcilers: svc.Reconcilers(), Logger: env.Logger, Clock: env.Clock},
		idem:     env.Idem, env: env, svc: svc,
	}
}

// intent is the part of a PaymentIntent the tests read.
type intent struct {
	ID            string `json:"id"`
	OrderID       string `json:"order_id"`
	Status        string `json:"status"`
	AmountMinor   int64  `json:"amount_minor"`
	Amount        string `json:"amount"`
	CapturedMinor int64  `json:"captured_minor"`
	Captured      string `json:"captured"`
	RefundedMinor int64  `json:"refunded_minor"`
	Refunded      string `json:"refunded"`
}

func (b *bundle) createIntent(t *testing.T, order, body string) intent {
	t.Helper()
	var in intent
	b.agent.Post("/v1/payment_intents", body, apitest.Key("create-"+order)).Status(t, http.StatusCreated).Decode(t, &in)
	return in
}

func (b *bundle) getIntent(t *testing.T, id string) intent {
	t.Helper()
	var in intent
	b.agent.Get("/v1/payment_intents/"+id).Status(t, http.StatusOK).Decode(t, &in)
	return in
}

func (b *bundle) assertCounters(t *testing.T, want map[string]int64) {
	t.Helper()
	got, err := b.provider.Counters(t.Context())
	if err != nil {
		t.Fatalf("provider counters: %v", err)
	}
	for _, kind := range []string{"authorize", "capture", "void", "refund"} {
		if got[kind] != want[kind] {
			t.Errorf("provider executed %s %d times; want %d (all: %v)", kind, got[kind], want[kind], got)
		}
	}
}

// operation reads the operation started under key.
func operation(t *testing.T, c *apitest.Client, key string) opstatus.Operation {
	t.Helper()
	var res struct {
		Items []opstatus.Operation `json:"items"`
	}
	c.Get("/v1/operations?idempotency_key="+key).Status(t, http.StatusOK).Decode(t, &res)
	if len(res.Items) != 1 {
		t.Fatalf("operations under key %q: %d; want 1", key, len(res.Items))
	}
	return res.Items[0]
}

func hasEvent(op opstatus.Operation, typ string) (opstatus.Event, bool) {
	for _, ev := range op.Events {
		if ev.Type == typ {
			return ev, true
		}
	}
	return opstatus.Event{}, false
}

func code(t *testing.T, r *apitest.Response) string {
	t.Helper()
	return r.Str(t, "code")
}

// race runs n requests at once behind a start barrier and returns their responses.
func race(n int, do func(i int) *apitest.Response) []*apitest.Response {
	out := make([]*apitest.Response, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = do(i)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// testLostCaptureAnswer: the provider executes the capture and drops the connection. The caller gets 202 with
// the operation unknown; a retry with the same key hands the operation to the capture reconciler (as serve wires
// it), which settles it from the provider's record, and the retry replays the capture. The provider captured once.
func testLostCaptureAnswer(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-lost", `{"order_id":"o-lost","amount":"25.00","currency":"USD"}`)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultDrop, Count: 1}); err != nil {
		t.Fatal(err)
	}

	path := "/v1/payment_intents/" + in.ID + "/capture"
	first := b.agent.Post(path, `{}`, apitest.Key("cap-1")).Status(t, http.StatusAccepted)
	var op opstatus.Operation
	first.Decode(t, &op)
	if op.State != opstatus.StateUnknown || op.Kind != payments.KindCapture || first.Header.Get("Operation-Id") != op.ID {
		t.Fatalf("202 operation = %+v (Operation-Id %q); want the capture, unknown", op, first.Header.Get("Operation-Id"))
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	if got := b.getIntent(t, in.ID).Status; got != "capturing" {
		t.Fatalf("intent status while unknown = %q; want capturing", got)
	}

	// The retry settles the operation from the provider's record; it never captures again.
	retry := b.agent.Post(path, `{}`, apitest.Key("cap-1")).Status(t, http.StatusOK)
	var captured intent
	retry.Decode(t, &captured)
	if retry.Header.Get("Idempotent-Replayed") != "true" || captured.Status != "succeeded" || captured.CapturedMinor != 2500 || captured.Captured != "25.00" {
		t.Fatalf("retry = %s (replayed %q); want the stored capture", retry.Body, retry.Header.Get("Idempotent-Replayed"))
	}
	if settled, err := b.recovery.RunOnce(t.Context()); err != nil || settled != 0 {
		t.Fatalf("recovery RunOnce after the retry settled it = %d, %v; want nothing left to settle", settled, err)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})

	got := operation(t, b.agent, "cap-1")
	if got.State != opstatus.StateSucceeded {
		t.Fatalf("operation state = %s; want succeeded", got.State)
	}
	ev, ok := hasEvent(got, payments.EventProviderLookup)
	if !ok || !strings.Contains(string(ev.Detail), `"found": true`) && !strings.Contains(string(ev.Detail), `"found":true`) {
		t.Fatalf("no provider_lookup evidence with found=true in %+v", got.Events)
	}
	if _, ok := hasEvent(got, opstore.EventReconciled); !ok {
		t.Fatalf("no reconciled event in %+v", got.Events)
	}

	// The timeline tells the story: the call left, its answer was lost, the lookup found the capture.
	var tl opstatus.Timeline
	b.agent.Get("/v1/operations/"+got.ID+"/timeline").Status(t, http.StatusOK).Decode(t, &tl)
	var story []string
	for _, e := range tl.Entries {
		s := e.Type
		if e.Outcome != "" {
			s += "/" + e.Outcome
		}
		story = append(story, s)
	}
	want := []string{"claimed", "dispatch_started", "dispatch_sent_no_response", "outcome_unknown/unknown",
		"provider_lookup", "reconciled", "replayed/replayed"}
	if strings.Join(story, " ") != strings.Join(want, " ") || !tl.Chain.Intact {
		t.Fatalf("timeline %v (chain intact %v); want %v", story, tl.Chain.Intact, want)
	}
	for _, e := range tl.Entries {
		if e.Type == "dispatch_sent_no_response" && !strings.Contains(string(e.Detail), `"reason":"connection_closed"`) {
			t.Errorf("the lost answer's reason: %s", e.Detail)
		}
	}
}

// testOwnerGone: a replica SIGKILLed after its capture's claim committed and before the call started leaves the
// operation running under a 30 s lease. A same-key retry to a live replica finds the claim's owner lock held by
// no session and no dispatch_started record: it releases the claim (cancelled, not_sent owner_gone, the intent's
// reservation undone) and captures, while the old lease still runs. The provider captured once.
func testOwnerGone(t *testing.T, h *harness) {
	db := testdb.Schema(t)
	start := func(failpoints string) *proctest.Process {
		return proctest.Start(t, h.bin, []string{"serve", "payments"}, map[string]string{
			"DATABASE_URL": db.DSN, "PROVIDER_URL": h.providerURL, "PROVIDER_SECRET": merchantSecret(t),
			"OPERATION_LEASE": "30s", "PROVIDER_TIMEOUT": "2s", "RETRYSAFE_FAILPOINTS": failpoints,
			"LOG_LEVEL": "info", // "owner lock held"
		}, "PAYMENTS_ADDR")
	}
	live := start("")
	agent := apitest.New(t, live.URL, servicetest.AgentSecret)
	var in intent
	agent.Post("/v1/payment_intents", `{"order_id":"o-gone","amount":"30.00","currency":"USD"}`, apitest.Key("create")).
		Status(t, http.StatusCreated).Decode(t, &in)

	doomed := start("idem.external.before_call" + "=pause")
	// Until a process holds its owner lock its claims are not marked (opstatus.HoldOwner); under load that can
	// outlast its start.
	doomed.WaitFor(t, "owner lock held")
	path := "/v1/payment_intents/" + in.ID + "/capture"
	done := make(chan error, 1)
	go func() {
		_, err := apitest.New(t, doomed.URL, servicetest.AgentSecret).Try(http.MethodPost, path, `{}`, apitest.Key("cap"))
		done <- err
	}()
	doomed.WaitFor(t, "failpoint "+"idem.external.before_call"+" reached")
	doomed.Kill(t)
	if err := <-done; err == nil {
		t.Fatal("the capture was answered although its process was killed first")
	}
	old := operation(t, agent, "cap")
	claimed, _ := hasEvent(old, opstore.EventClaimed)
	var mark struct {
		Owner int64 `json:"owner"`
	}
	if err := json.Unmarshal(claimed.Detail, &mark); err != nil || old.State != opstatus.StateRunning || old.LeaseExpiresAt == nil || mark.Owner == 0 {
		t.Fatalf("the killed replica's operation: %s, lease %v, claimed %s; want running, leased, its owner marked", old.State, old.LeaseExpiresAt, claimed.Detail)
	}

	// A client's retry: 409 request_in_progress only while the killed process's session has not ended yet.
	var retry *apitest.Response
	servicetest.Eventually(t, "a retry answered other than 409", func() bool {
		retry = agent.Post(path, `{}`, apitest.Key("cap"))
		return retry.Code != http.StatusConflict
	})
	var captured intent
	retry.Status(t, http.StatusOK).Decode(t, &captured)
	if !time.Now().Before(*old.LeaseExpiresAt) {
		t.Fatalf("the old lease (until %s) ended before the retry was answered: the test proves nothing", old.LeaseExpiresAt)
	}
	if captured.Status != "succeeded" || captured.CapturedMinor != 3000 || retry.Header.Get("Operation-Id") == old.ID {
		t.Fatalf("retry = %s (operation %s); want the capture, by a new operation", retry.Body, retry.Header.Get("Operation-Id"))
	}
	b := &bundle{provider: provider.NewClientHTTP(h.providerURL, merchantSecret(t), apitest.HTTPClient(t, 2*time.Second))}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})

	var released opstatus.Operation
	agent.Get("/v1/operations/"+old.ID).Status(t, http.StatusOK).Decode(t, &released)
	ev, ok := hasEvent(released, "not_sent")
	var why struct {
		Reason string `json:"reason"`
		Owner  int64  `json:"owner"`
	}
	if !ok || json.Unmarshal(ev.Detail, &why) != nil || released.State != opstatus.StateCancelled ||
		why.Reason != "owner_gone" || why.Owner != mark.Owner {
		t.Fatalf("the killed replica's operation: %s with %+v; want cancelled, not_sent owner_gone naming owner %d", released.State, released.Events, mark.Owner)
	}
	if _, ok := hasEvent(released, opstore.EventDispatchStarted); ok {
		t.Fatal("a released operation has a dispatch_started record")
	}
}

// testOwnerLostItsLock: the process that claimed a capture is alive, but the session of its owner lock ends
// before its call starts (as in a database failover). A same-key retry releases the claim and captures; the
// first request's call is then refused, because its dispatch_started record cannot be written for a cancelled
// operation, and never sent. The provider captured once, and the first request gets the retry's capture.
func testOwnerLostItsLock(t *testing.T, h *harness) {
	env := servicetest.New(t)
	owner, err := opstatus.HoldOwner(env.DB.DSN, env.Logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	env.Idem.Owner = owner
	client := provider.NewClientHTTP(h.providerURL, merchantSecret(t), apitest.HTTPClient(t, 2*time.Second))
	svc, err := payments.New(env.Deps, payments.Config{Provider: client, ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{agent: env.Serve(t, svc), provider: client}
	servicetest.Eventually(t, "the owner lock is held", func() bool { return owner.ID() != 0 })
	in := b.createIntent(t, "o-lock", `{"order_id":"o-lock","amount":"8.00","currency":"USD"}`)
	path, key := "/v1/payment_intents/"+in.ID+"/capture", "cap-lost-lock"

	var (
		fired atomic.Bool
		retry *apitest.Response
	)
	// Hooks are process-wide: act only on this test's capture, and only on its first call.
	unset := failpoint.Set("idem.external.before_call", func(d any) {
		op, _ := d.(opstatus.Operation)
		if op.Kind != payments.KindCapture || op.IdempotencyKey != key || !fired.CompareAndSwap(false, true) {
			return
		}
		lock := `FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND objid::bigint = ?`
		if err := env.DB.DB.Exec(`SELECT pg_terminate_backend(pid) `+lock, owner.ID()).Error; err != nil {
			t.Error(err)
			return
		}
		servicetest.Eventually(t, "the owner lock is gone", func() bool {
			var n int64
			return env.DB.DB.Raw(`SELECT count(*) `+lock, owner.ID()).Scan(&n).Error == nil && n == 0
		})
		retry = b.agent.Post(path, `{}`, apitest.Key(key))
	})
	defer unset()
	first := b.agent.Post(path, `{}`, apitest.Key(key))

	if retry == nil {
		t.Fatal("the failpoint never fired")
	}
	var captured intent
	retry.Status(t, http.StatusOK).Decode(t, &captured)
	if captured.Status != "succeeded" || captured.CapturedMinor != 800 {
		t.Fatalf("retry = %s; want the capture", retry.Body)
	}
	first.Status(t, http.StatusOK)
	if first.Header.Get("Operation-Id") != retry.Header.Get("Operation-Id") {
		t.Fatalf("first request answered for operation %s; want the retry's %s", first.Header.Get("Operation-Id"), retry.Header.Get("Operation-Id"))
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})

	var list struct {
		Items []opstatus.Operation `json:"items"`
	}
	b.agent.Get("/v1/operations?idempotency_key="+key).Status(t, http.StatusOK).Decode(t, &list)
	if len(list.Items) != 2 {
		t.Fatalf("operations under the key: %d; want the released one and the retry's", len(list.Items))
	}
	released := list.Items[1]
	reason := func(typ string) string {
		ev, _ := hasEvent(released, typ)
		var d struct {
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal(ev.Detail, &d)
		return d.Reason
	}
	_, started := hasEvent(released, opstore.EventDispatchStarted)
	if released.State != opstatus.StateCancelled || reason("not_sent") != "owner_gone" || started ||
		reason(opstore.EventDispatchNotSent) != opstore.ReasonEvidenceNotRecorded || list.Items[0].State != opstatus.StateSucceeded {
		var types []string
		for _, ev := range released.Events {
			types = append(types, ev.Type+" "+string(ev.Detail))
		}
		t.Fatalf("released operation %s with %q, retry's %s; want cancelled owner_gone, its call refused and never started",
			released.State, types, list.Items[0].State)
	}
}

// testAnsweredFailureSettles: the provider answers the capture 503 without executing it. The answer came back,
// so the call is over: a same-key retry right after, while the operation's lease still runs, looks the key up,
// finds nothing, and settles the operation at once (the final 502, replayed), with the dispatch record that made
// the negative lookup conclusive named in the evidence. The provider captured nothing.
func testAnsweredFailureSettles(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-503", `{"order_id":"o-503","amount":"12.00","currency":"USD"}`)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindCapture, Mode: provider.FaultFail, Count: 1}); err != nil {
		t.Fatal(err)
	}
	path := "/v1/payment_intents/" + in.ID + "/capture"
	var first opstatus.Operation
	b.agent.Post(path, `{}`, apitest.Key("cap-503")).Status(t, http.StatusAccepted).Decode(t, &first)
	if first.State != opstatus.StateUnknown || first.LeaseExpiresAt == nil {
		t.Fatalf("first answer: operation %+v; want unknown, leased", first)
	}

	retry := b.agent.Post(path, `{}`, apitest.Key("cap-503")).Status(t, http.StatusBadGateway)
	if code(t, retry) != "provider_unavailable" || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %s (replayed %q); want the settled 502, replayed", retry.Body, retry.Header.Get("Idempotent-Replayed"))
	}
	if !time.Now().Before(*first.LeaseExpiresAt) {
		t.Fatalf("the lease (until %s) ended before the retry was answered: the test proves nothing", first.LeaseExpiresAt)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})
	if got := b.getIntent(t, in.ID); got.Status != "requires_capture" || got.CapturedMinor != 0 {
		t.Fatalf("intent after the settled failure = %+v; want requires_capture, nothing captured", got)
	}

	got := operation(t, b.agent, "cap-503")
	var story []string
	for _, ev := range got.Events {
		story = append(story, ev.Type)
	}
	want := []string{"claimed", "dispatch_started", "dispatch_response_received", "outcome_unknown",
		payments.EventProviderLookup, "reconciled", "replayed"}
	if got.State != opstatus.StateFailed || strings.Join(story, " ") != strings.Join(want, " ") {
		t.Fatalf("operation %s with events %v; want failed with %v", got.State, story, want)
	}
	lookup, _ := hasEvent(got, payments.EventProviderLookup)
	var evidence struct {
		Found        *bool  `json:"found"`
		Conclusive   string `json:"conclusive_because"`
		LeaseRunning bool   `json:"lease_running"`
	}
	if err := json.Unmarshal(lookup.Detail, &evidence); err != nil || evidence.Found == nil || *evidence.Found ||
		evidence.Conclusive != opstore.EventDispatchResponseReceived || evidence.LeaseRunning {
		t.Fatalf("provider_lookup evidence %s; want not found, conclusive because of dispatch_response_received", lookup.Detail)
	}
	if ev, _ := hasEvent(got, "reconciled"); !strings.Contains(string(ev.Detail), `"reason":"provider_unavailable"`) {
		t.Fatalf("reconciled event %s; want reason provider_unavailable", ev.Detail)
	}
}

// testUnreachableProviderIsNotSent: a call that never connects is not_sent, a definite failure that names
// no unknown outcome, and the provider executed nothing.
func testUnreachableProviderIsNotSent(t *testing.T, h *harness) {
	b := h.setupWith(t, "http://"+proctest.FreeAddr(t))
	res := b.agent.Post("/v1/payment_intents", `{"order_id":"o-down","amount":"5.00","currency":"USD"}`, apitest.Key("down-1")).
		Status(t, http.StatusBadGateway)
	if code(t, res) != "provider_unavailable" {
		t.Fatalf("code %s", code(t, res))
	}
	got := operation(t, b.agent, "down-1")
	ev, ok := hasEvent(got, "dispatch_not_sent")
	if got.State != opstatus.StateFailed || !ok || !strings.Contains(string(ev.Detail), `"reason":"connection_refused"`) {
		t.Fatalf("operation %s with events %+v", got.State, got.Events)
	}
	if _, ok := hasEvent(got, opstore.EventOutcomeUnknown); ok {
		t.Fatal("a call that never left was called unknown")
	}
	if ev, ok := hasEvent(got, opstore.EventCompleted); !ok || !strings.Contains(string(ev.Detail), `"reason":"provider_unavailable"`) {
		t.Errorf("the failure's reason is not recorded: %+v", ev)
	}
}

// testProviderSaysItReplayed: a second call with one key is answered from the provider's stored answer, and
// the dispatch record says so.
func testProviderSaysItReplayed(t *testing.T, h *harness) {
	b := h.setup(t)
	var seen []provider.Dispatch
	var mu sync.Mutex
	ctx := provider.WithDispatchObserver(t.Context(), observerFunc(func(d provider.Dispatch) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, d)
	}))
	req := provider.AuthorizeRequest{AmountMinor: 700, Currency: "USD"}
	for range 2 {
		if _, err := b.provider.Authorize(ctx, "replay-key-1", req); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 2 || seen[0].Replayed || !seen[1].Replayed || seen[0].RemoteRef == "" || seen[0].RemoteRef != seen[1].RemoteRef ||
		seen[0].BodySHA256 != seen[1].BodySHA256 || seen[1].State != provider.DispatchResponseReceived || seen[1].Status != http.StatusCreated && seen[1].Status != http.StatusOK {
		t.Fatalf("dispatches %+v", seen)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})
}

type observerFunc func(provider.Dispatch)

func (f observerFunc) Started(context.Context, provider.Dispatch) error { return nil }
func (f observerFunc) Finished(_ context.Context, d provider.Dispatch)  { f(d) }

// testConcurrentCapturesOneKey: 100 captures of one intent under one key at once capture once.
func testConcurrentCapturesOneKey(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-100", `{"order_id":"o-100","amount_minor":5000,"currency":"USD"}`)
	path := "/v1/payment_intents/" + in.ID + "/capture"
	res := race(100, func(int) *apitest.Response { return b.agent.Post(path, `{}`, apitest.Key("same-key")) })
	ok := 0
	for _, r := range res {
		switch {
		case r.Code == http.StatusOK:
			ok++
		case r.Code == http.StatusConflict && code(t, r) == "request_in_progress":
		default:
			t.Errorf("capture: %d %s; want 200 or 409 request_in_progress", r.Code, r.Body)
		}
	}
	if ok == 0 {
		t.Error("no capture succeeded")
	}
	b.agent.Post(path, `{}`, apitest.Key("same-key")).Status(t, http.StatusOK)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	if got := b.getIntent(t, in.ID); got.Status != "succeeded" || got.CapturedMinor != 5000 {
		t.Fatalf("intent = %+v; want succeeded, 5000 captured", got)
	}
}

// testConcurrentCapturesDifferentKeys: 20 captures of one intent under 20 keys at once: one captures, the
// others are refused with invalid_state and leave their keys free.
func testConcurrentCapturesDifferentKeys(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-20", `{"order_id":"o-20","amount_minor":5000,"currency":"USD"}`)
	path := "/v1/payment_intents/" + in.ID + "/capture"
	res := race(20, func(i int) *apitest.Response {
		return b.agent.Post(path, `{"amount_minor":4000}`, apitest.Key(fmt.Sprintf("key-%d", i)))
	})
	ok := 0
	for _, r := range res {
		switch {
		case r.Code == http.StatusOK:
			ok++
		case r.Code == http.StatusConflict && code(t, r) == "invalid_state":
		default:
			t.Errorf("capture: %d %s; want 200 or 409 invalid_state", r.Code, r.Body)
		}
	}
	if ok != 1 {
		t.Errorf("%d captures succeeded; want exactly 1", ok)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	if got := b.getIntent(t, in.ID); got.Status != "succeeded" || got.CapturedMinor != 4000 {
		t.Fatalf("intent = %+v; want succeeded, 4000 captured (the rest released)", got)
	}
}

// testCrash kills `retrysafe serve payments` (SIGKILL) at failpoint, after the claim and before or after the
// provider call. A restarted process's recovery worker settles the operation from the provider's record; the
// provider captured once at most, and a retry with the same key gets the settled result.
func testCrash(t *testing.T, h *harness, failpoint string) {
	db := testdb.Schema(t)
	env := map[string]string{
		"DATABASE_URL": db.DSN, "PROVIDER_URL": h.providerURL, "PROVIDER_SECRET": merchantSecret(t),
		"OPERATION_LEASE": "2s", "RECOVERY_INTERVAL": "200ms", "PROVIDER_TIMEOUT": "1s",
	}
	start := func(failpoints string) *proctest.Process {
		e := map[string]string{"RETRYSAFE_FAILPOINTS": failpoints}
		for k, v := range env {
			e[k] = v
		}
		return proctest.Start(t, h.bin, []string{"serve", "payments"}, e, "PAYMENTS_ADDR")
	}
	prov := provider.NewClientHTTP(h.providerURL, merchantSecret(t), apitest.HTTPClient(t, 2*time.Second))
	counters := func() map[string]int64 {
		c, err := prov.Counters(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// The intent is created by a process without failpoints (creating is an external call too).
	p0 := start("")
	var in intent
	apitest.New(t, p0.URL, servicetest.AgentSecret).
		Post("/v1/payment_intents", `{"order_id":"o-crash","amount":"40.00","currency":"USD"}`, apitest.Key("create")).
		Status(t, http.StatusCreated).Decode(t, &in)
	p0.Kill(t)

	p1 := start(failpoint + "=pause")
	path := "/v1/payment_intents/" + in.ID + "/capture"
	done := make(chan error, 1)
	go func() {
		_, err := apitest.New(t, p1.URL, servicetest.AgentSecret).Try(http.MethodPost, path, `{}`, apitest.Key("cap"))
		done <- err
	}()
	p1.WaitFor(t, "failpoint "+failpoint+" reached")
	p1.Kill(t)
	if err := <-done; err == nil {
		t.Fatal("the capture was answered although the process was killed before answering")
	}
	wantCaptures := int64(1)
	if failpoint == "idem.external.before_call" {
		wantCaptures = 0
	}
	if got := counters()["capture"]; got != wantCaptures {
		t.Fatalf("captures at the provider after the kill = %d; want %d", got, wantCaptures)
	}

	p2 := start("")
	agent := apitest.New(t, p2.URL, servicetest.AgentSecret)
	var op opstatus.Operation
	servicetest.Eventually(t, "the restarted process settles the operation", func() bool {
		op = operation(t, agent, "cap")
		return op.State.Final()
	})
	if _, ok := hasEvent(op, payments.EventProviderLookup); !ok {
		t.Fatalf("no provider_lookup evidence in %+v", op.Events)
	}

	// The killed attempt never answered, and still has its attempt record: number 1, outcome unknown, written
	// by the recovery worker when the lease ran out; the settlement does not number it again.
	claimed, _ := hasEvent(op, "claimed")
	var claim struct {
		AttemptID string `json:"attempt_id"`
	}
	if err := json.Unmarshal(claimed.Detail, &claim); err != nil || claim.AttemptID == "" {
		t.Fatalf("claimed event without an attempt id: %s", claimed.Detail)
	}
	killedAttempt := func(op opstatus.Operation) []string {
		var recs []string
		for _, ev := range op.Events {
			var d struct {
				AttemptID string `json:"attempt_id"`
				Outcome   string `json:"outcome"`
				Reason    string `json:"reason"`
			}
			_ = json.Unmarshal(ev.Detail, &d)
			if ev.Attempt != nil && d.AttemptID == claim.AttemptID {
				recs = append(recs, fmt.Sprintf("#%d %s %s %s", *ev.Attempt, ev.Type, d.Outcome, d.Reason))
			}
		}
		return recs
	}
	want := "#1 lease_expired unknown " + opstore.ReasonLeaseExpired
	if recs := killedAttempt(op); len(recs) != 1 || recs[0] != want {
		t.Fatalf("attempt records of the killed attempt %s: %v; want [%s]", claim.AttemptID, recs, want)
	}

	retry := agent.Post(path, `{}`, apitest.Key("cap"))
	if retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d %s; want the settled result replayed", retry.Code, retry.Body)
	}
	var tl opstatus.Timeline
	agent.Get("/v1/operations/"+op.ID+"/timeline").Status(t, http.StatusOK).Decode(t, &tl)
	var numbers []int64
	for _, e := range tl.Entries {
		if e.Attempt != nil {
			numbers = append(numbers, *e.Attempt)
		}
	}
	if !tl.Chain.Intact || fmt.Sprint(numbers) != "[1 2]" || len(killedAttempt(operation(t, agent, "cap"))) != 1 {
		t.Fatalf("timeline after the retry: chain %+v, attempt numbers %v; want intact, [1 2]", tl.Chain, numbers)
	}
	var got intent
	agent.Get("/v1/payment_intents/"+in.ID).Status(t, http.StatusOK).Decode(t, &got)
	if wantCaptures == 1 {
		retry.Status(t, http.StatusOK)
		if op.State != opstatus.StateSucceeded || got.Status != "succeeded" || got.CapturedMinor != 4000 {
			t.Fatalf("after restart: operation %s, intent %+v; want succeeded, 4000 captured", op.State, got)
		}
	} else {
		retry.Status(t, http.StatusBadGateway)
		if code(t, retry) != "provider_unavailable" || op.State != opstatus.StateFailed || got.Status != "requires_capture" {
			t.Fatalf("after restart: %s, operation %s, intent %+v; want provider_unavailable, failed, requires_capture", retry.Body, op.State, got)
		}
		// The reservation is released: a new capture under a new key captures, once.
		agent.Post(path, `{}`, apitest.Key("cap-again")).Status(t, http.StatusOK)
		wantCaptures = 1
	}
	if got := counters()["capture"]; got != wantCaptures {
		t.Fatalf("captures at the provider = %d; want %d", got, wantCaptures)
	}
}

// testAmountSpellings: "12.3", "12.30" and amount_minor 1230 are one request under one key; a changed amount
// under the same key is idempotency_key_reused.
func testAmountSpellings(t *testing.T, h *harness) {
	b := h.setup(t)
	first := b.agent.Post("/v1/payment_intents", `{"order_id":"o-sp","amount":"12.3","currency":"USD"}`, apitest.Key("k")).
		Status(t, http.StatusCreated)
	for _, body := range []string{
		`{"order_id":"o-sp","amount":"12.30","currency":"USD"}`,
		`{"currency":"USD","amount_minor":1230,"order_id":"o-sp"}`,
	} {
		r := b.agent.Post("/v1/payment_intents", body, apitest.Key("k")).Status(t, http.StatusCreated)
		if r.Header.Get("Idempotent-Replayed") != "true" || string(r.Body) != string(first.Body) {
			t.Fatalf("%s: not a byte-for-byte replay: %s", body, r.Body)
		}
	}
	r := b.agent.Post("/v1/payment_intents", `{"order_id":"o-sp","amount":"12.31","currency":"USD"}`, apitest.Key("k")).
		Status(t, http.StatusUnprocessableEntity)
	if code(t, r) != "idempotency_key_reused" || r.Str(t, "operation_id") == "" {
		t.Fatalf("changed amount: %s; want idempotency_key_reused with operation_id", r.Body)
	}
	var in intent
	first.Decode(t, &in)
	if in.AmountMinor != 1230 || in.Amount != "12.30" || in.Status != "requires_capture" {
		t.Fatalf("intent = %+v; want 1230 minor, \"12.30\", requires_capture", in)
	}

	// The same holds for a capture: "5" and amount_minor 500 are one capture.
	path := "/v1/payment_intents/" + in.ID + "/capture"
	b.agent.Post(path, `{"amount":"5"}`, apitest.Key("c")).Status(t, http.StatusOK)
	b.agent.Post(path, `{"amount_minor":500}`, apitest.Key("c")).Status(t, http.StatusOK)
	r = b.agent.Post(path, `{"amount_minor":501}`, apitest.Key("c")).Status(t, http.StatusUnprocessableEntity)
	if code(t, r) != "idempotency_key_reused" {
		t.Fatalf("changed capture amount: %s; want idempotency_key_reused", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
}

// testConcurrentRefunds: ten refunds of 3.00 against 10.00 captured, at once under ten keys: three succeed,
// seven are amount_too_large, and the refunded total is 9.00 here and at the provider.
func testConcurrentRefunds(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-ref", `{"order_id":"o-ref","amount":"10.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap")).Status(t, http.StatusOK)
	res := race(10, func(i int) *apitest.Response {
		return b.agent.Post("/v1/payment_intents/"+in.ID+"/refunds", `{"amount":"3.00","reason":"partial"}`,
			apitest.Key(fmt.Sprintf("refund-%d", i)))
	})
	ok := 0
	for _, r := range res {
		switch {
		case r.Code == http.StatusCreated:
			ok++
		case r.Code == http.StatusUnprocessableEntity && code(t, r) == "amount_too_large":
		default:
			t.Errorf("refund: %d %s; want 201 or 422 amount_too_large", r.Code, r.Body)
		}
	}
	if ok != 3 {
		t.Errorf("%d refunds succeeded; want 3", ok)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 3})
	if got := b.getIntent(t, in.ID); got.RefundedMinor != 900 || got.Refunded != "9.00" {
		t.Fatalf("intent = %+v; want 900 refunded", got)
	}
	var list struct {
		Items []struct {
			ID          string `json:"id"`
			AmountMinor int64  `json:"amount_minor"`
			Status      string `json:"status"`
		} `json:"items"`
	}
	b.agent.Get("/v1/payment_intents/"+in.ID+"/refunds").Status(t, http.StatusOK).Decode(t, &list)
	if len(list.Items) != 3 {
		t.Fatalf("refunds = %+v; want 3", list.Items)
	}
	for _, rf := range list.Items {
		if rf.Status != "succeeded" || rf.AmountMinor != 300 {
			t.Errorf("refund %+v; want succeeded, 300", rf)
		}
		b.agent.Get("/v1/refunds/"+rf.ID).Status(t, http.StatusOK)
		b.other.Get("/v1/refunds/"+rf.ID).Status(t, http.StatusNotFound)
	}
	// 1.00 is left: more is refused, exactly that is refunded.
	b.agent.Post("/v1/payment_intents/"+in.ID+"/refunds", `{"amount_minor":101}`, apitest.Key("r-over")).Status(t, http.StatusUnprocessableEntity)
	b.agent.Post("/v1/payment_intents/"+in.ID+"/refunds", `{"amount_minor":100}`, apitest.Key("r-rest")).Status(t, http.StatusCreated)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 4})
}

// testRacingIntents: ten creates for one order under ten keys at once make one intent and one authorization;
// the others name it.
func testRacingIntents(t *testing.T, h *harness) {
	b := h.setup(t)
	res := race(10, func(i int) *apitest.Response {
		return b.agent.Post("/v1/payment_intents", `{"order_id":"o-race","amount":"9.99","currency":"EUR"}`,
			apitest.Key(fmt.Sprintf("create-%d", i)))
	})
	var winner string
	var existing []string
	for _, r := range res {
		switch {
		case r.Code == http.StatusCreated:
			if winner != "" {
				t.Errorf("a second intent was created: %s", r.Body)
			}
			winner = r.Str(t, "id")
		case r.Code == http.StatusConflict && code(t, r) == "order_has_active_intent":
			existing = append(existing, r.Str(t, "existing_intent_id"))
		default:
			t.Errorf("create: %d %s; want 201 or 409 order_has_active_intent", r.Code, r.Body)
		}
	}
	for _, id := range existing {
		if id != winner {
			t.Errorf("existing_intent_id = %q; want %q", id, winner)
		}
	}
	var n int64
	if err := b.db.Raw(`SELECT count(*) FROM payment_intents WHERE order_id = 'o-race'`).Scan(&n).Error; err != nil || n != 1 {
		t.Fatalf("intents for the order = %d, %v; want 1", n, err)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})
}

// testAmountValidation: wrong JSON types are 400 invalid_request, unacceptable values 422 validation_failed;
// neither reaches the provider nor burns the key.
func testAmountValidation(t *testing.T, h *harness) {
	b := h.setup(t)
	for _, tt := range []struct {
		body   string
		status int
		field  string
	}{
		{`{"order_id":"o","amount_minor":12.5,"currency":"USD"}`, 400, ""},
		{`{"order_id":"o","amount":12.30,"currency":"USD"}`, 400, ""},
		{`{"order_id":"o","amount":"12.30","currency":"USD","extra":1}`, 400, ""},
		{`{"order_id":"o","amount":"12.345","currency":"USD"}`, 422, "amount"},
		{`{"order_id":"o","amount":"1.5","currency":"JPY"}`, 422, "amount"},
		{`{"order_id":"o","amount":"0","currency":"USD"}`, 422, "amount"},
		{`{"order_id":"o","amount":"-1","currency":"USD"}`, 422, "amount"},
		{`{"order_id":"o","amount":"1e3","currency":"USD"}`, 422, "amount"},
		{`{"order_id":"o","amount_minor":9007199254740992,"currency":"USD"}`, 422, "amount_minor"},
		// A number amount_minor cannot hold is one answer, however it is written: beyond a double's exactness,
		// beyond int64, beyond a double's range.
		{`{"order_id":"o","amount_minor":9007199254740993,"currency":"USD"}`, 422, "amount_minor"},
		{`{"order_id":"o","amount_minor":1e23,"currency":"USD"}`, 422, "amount_minor"},
		{`{"order_id":"o","amount_minor":10000000000000000000,"currency":"USD"}`, 422, "amount_minor"},
		{`{"order_id":"o","amount_minor":1` + strings.Repeat("0", 399) + `,"currency":"USD"}`, 422, "amount_minor"},
		{`{"order_id":"o","amount_minor":1` + strings.Repeat("0", 299) + `,"currency":"USD"}`, 422, "amount_minor"},
		{`{"order_id":"o","amount":"1.00","currency":"XXX"}`, 422, "currency"},
		{`{"order_id":"o","amount":"1.00","amount_minor":100,"currency":"USD"}`, 422, "amount"},
		{`{"order_id":"","amount":"1.00","currency":"USD"}`, 422, "order_id"},
	} {
		r := b.agent.Post("/v1/payment_intents", tt.body, apitest.Key("same")).Status(t, tt.status)
		if tt.field != "" && !strings.Contains(string(r.Body), `"field":"`+tt.field+`"`) {
			t.Errorf("%s: %s; want an error on %s", tt.body, r.Body, tt.field)
		}
	}
	// The key stayed free, and amounts come back formatted in the currency's decimals.
	jpy := b.agent.Post("/v1/payment_intents", `{"order_id":"o","amount":"1000","currency":"JPY"}`, apitest.Key("same")).Status(t, http.StatusCreated)
	kwd := b.createIntent(t, "o-kwd", `{"order_id":"o-kwd","amount_minor":1500,"currency":"KWD"}`)
	if jpy.Str(t, "amount") != "1000" || kwd.Amount != "1.500" {
		t.Fatalf("formatted amounts %q JPY, %q KWD; want 1000 and 1.500", jpy.Str(t, "amount"), kwd.Amount)
	}
	// A capture above the authorized amount never reaches the provider.
	r := b.agent.Post("/v1/payment_intents/"+kwd.ID+"/capture", `{"amount":"1.501"}`, apitest.Key("c")).Status(t, http.StatusUnprocessableEntity)
	if code(t, r) != "amount_too_large" {
		t.Fatalf("capture above authorized: %s", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 2})
}

// testApproval: a capture above the USD threshold needs an approved approval bound to its key and body.
func testApproval(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-big", `{"order_id":"o-big","amount":"2500.00","currency":"USD"}`)
	path := "/v1/payment_intents/" + in.ID + "/capture"
	r := b.agent.Post(path, `{}`, apitest.Key("big")).Status(t, http.StatusPreconditionRequired)
	if code(t, r) != "approval_required" {
		t.Fatalf("capture without approval: %s", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})

	req, _ := json.Marshal(map[string]any{"method": "POST", "path": path, "idempotency_key": "big", "body": map[string]any{}})
	apv := b.agent.Post("/v1/approvals", string(req), apitest.Key("apv-1")).Status(t, http.StatusCreated)
	id := apv.Str(t, "id")
	// Pending is not enough.
	b.agent.Post(path, `{}`, apitest.Key("big"), apitest.Header("Approval-Id", id)).Status(t, http.StatusForbidden)
	b.approver.Post("/v1/approvals/"+id+"/approve", `{}`).Status(t, http.StatusOK)
	// A changed body does not match the approved fingerprint.
	b.agent.Post(path, `{"amount":"2000.00"}`, apitest.Key("big"), apitest.Header("Approval-Id", id)).Status(t, http.StatusForbidden)
	b.agent.Post(path, `{}`, apitest.Key("big"), apitest.Header("Approval-Id", id)).Status(t, http.StatusOK)
	// A replay needs no new approval.
	b.agent.Post(path, `{}`, apitest.Key("big")).Status(t, http.StatusOK)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})

	// Below the threshold a refund needs none.
	b.agent.Post("/v1/payment_intents/"+in.ID+"/refunds", `{"amount":"10.00"}`, apitest.Key("small-refund")).Status(t, http.StatusCreated)
}

// testCancelAndScope: cancel voids once and frees the order; a canceled intent cannot be captured; another
// account sees nothing.
func testCancelAndScope(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-cancel", `{"order_id":"o-cancel","amount":"5.00","currency":"USD"}`)
	b.other.Get("/v1/payment_intents/"+in.ID).Status(t, http.StatusNotFound)
	b.other.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("x")).Status(t, http.StatusNotFound)
	b.other.Post("/v1/payment_intents/"+in.ID+"/cancel", `{}`, apitest.Key("x")).Status(t, http.StatusNotFound)

	var canceled intent
	b.agent.Do(http.MethodPost, "/v1/payment_intents/"+in.ID+"/cancel", nil, apitest.Key("cancel")).Status(t, http.StatusOK).Decode(t, &canceled)
	if canceled.Status != "canceled" {
		t.Fatalf("canceled intent = %+v", canceled)
	}
	b.agent.Do(http.MethodPost, "/v1/payment_intents/"+in.ID+"/cancel", nil, apitest.Key("cancel")).Status(t, http.StatusOK)
	r := b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap")).Status(t, http.StatusConflict)
	if code(t, r) != "invalid_state" {
		t.Fatalf("capture after cancel: %s", r.Body)
	}
	// The order is free again.
	b.agent.Post("/v1/payment_intents", `{"order_id":"o-cancel","amount":"5.00","currency":"USD"}`, apitest.Key("again")).Status(t, http.StatusCreated)
	b.assertCounters(t, map[string]int64{"authorize": 2, "void": 1})
}

// testDuplicateEffect: the provider executes one authorization twice and loses the answer. The lookup shows
// both: the operation ends duplicate_effect_confirmed with both remote ids, and nothing is retried.
func testDuplicateEffect(t *testing.T, h *harness) {
	b := h.setup(t)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindAuthorize, Mode: provider.FaultDuplicate, Count: 1}); err != nil {
		t.Fatal(err)
	}
	body := `{"order_id":"o-dup","amount":"9.00","currency":"USD"}`
	b.agent.Post("/v1/payment_intents", body, apitest.Key("dup-1")).Status(t, http.StatusAccepted)
	b.assertCounters(t, map[string]int64{"authorize": 2})
	if _, err := b.recovery.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := operation(t, b.agent, "dup-1")
	if got.State != opstatus.StateDuplicateEffect {
		t.Fatalf("state %s, events %+v", got.State, got.Events)
	}
	retry := b.agent.Post("/v1/payment_intents", body, apitest.Key("dup-1")).Status(t, http.StatusConflict)
	var p struct {
		Code      string   `json:"code"`
		RemoteIDs []string `json:"remote_ids"`
	}
	retry.Decode(t, &p)
	if p.Code != "duplicate_effect_confirmed" || len(p.RemoteIDs) != 2 || p.RemoteIDs[0] == p.RemoteIDs[1] {
		t.Fatalf("replayed answer %s", retry.Body)
	}
	if _, err := b.recovery.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	b.assertCounters(t, map[string]int64{"authorize": 2})
	ev, ok := hasEvent(got, opstore.EventReconciled)
	if !ok || !strings.Contains(string(ev.Detail), `"reason":"duplicate_effect_confirmed"`) {
		t.Errorf("reconciled event %+v", ev)
	}
}

// testStrictJSON: a body that two readers could read as two requests (a member twice, a name that matches a
// field only by case) is 400 naming the member, in a write and in the body an approval is asked for; nothing
// reaches the provider, no approval is stored, and the key stays free.
func testStrictJSON(t *testing.T, h *harness) {
	b := h.setup(t)
	for _, tt := range []struct{ body, field string }{
		{`{"order_id":"o","amount":"1.00","amount":"9999.00","currency":"USD"}`, "amount"},
		{`{"order_id":"o","AMOUNT":"7.00","currency":"USD"}`, "AMOUNT"},
		{`{"order_id":"o","Order_Id":"p","amount":"7.00","currency":"USD"}`, "Order_Id"},
	} {
		r := b.agent.Post("/v1/payment_intents", tt.body, apitest.Key("strict")).Status(t, http.StatusBadRequest)
		if code(t, r) != "invalid_request" || !strings.Contains(string(r.Body), `"field":"`+tt.field+`"`) {
			t.Errorf("%s: %s; want invalid_request naming %s", tt.body, r.Body, tt.field)
		}
	}
	in := b.createIntent(t, "o-strict", `{"order_id":"o-strict","amount":"2500.00","currency":"USD"}`)
	path := "/v1/payment_intents/" + in.ID + "/capture"
	r := b.agent.Post(path, `{"amount":"1.00","amount":"2500.00"}`, apitest.Key("cap")).Status(t, http.StatusBadRequest)
	if code(t, r) != "invalid_request" {
		t.Errorf("capture with a duplicate amount: %s", r.Body)
	}
	req := `{"method":"POST","path":"` + path + `","idempotency_key":"cap","body":{"amount":"1.00","amount":"2500.00"}}`
	r = b.agent.Post("/v1/approvals", req, apitest.Key("apv")).Status(t, http.StatusBadRequest)
	if !strings.Contains(string(r.Body), `"field":"body.amount"`) {
		t.Errorf("approval of a body with a duplicate amount: %s", r.Body)
	}
	var approvals int64
	if err := b.db.DB.Table("approvals").Where("idempotency_key = 'cap'").Count(&approvals).Error; err != nil || approvals != 0 {
		t.Errorf("%d approvals stored (%v)", approvals, err)
	}
	// Text a person reads (a refund's reason, an intent's description) refuses bidirectional and zero-width
	// characters, before the provider is called.
	b.agent.Post(path, `{}`, apitest.Key("cap-ok"), b.approval(t, path, "cap-ok", `{}`)).Status(t, http.StatusOK)
	for _, reason := range []string{"refund \u202e00.0001", "dup\u200bli\u200bcate", "line\\nbreak"} {
		r := b.agent.Post("/v1/payment_intents/"+in.ID+"/refunds", `{"amount":"1.00","reason":"`+reason+`"}`, apitest.Key("rf")).
			Status(t, http.StatusUnprocessableEntity)
		if !strings.Contains(string(r.Body), `"field":"reason"`) {
			t.Errorf("reason %q: %s", reason, r.Body)
		}
	}
	b.agent.Post("/v1/payment_intents", `{"order_id":"o-d","amount":"1.00","currency":"USD","description":"\u2067x"}`, apitest.Key("d")).
		Status(t, http.StatusUnprocessableEntity)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1})
	// The key refused above was never claimed.
	b.agent.Post("/v1/payment_intents", `{"order_id":"o","amount":"7.00","currency":"USD"}`, apitest.Key("strict")).Status(t, http.StatusCreated)
}

// approval requests an approval of POST path with key and body as the agent, grants it as the approver and
// returns the Approval-Id header that names it.
func (b *bundle) approval(t *testing.T, path, key, body string) apitest.Option {
	t.Helper()
	req := `{"method":"POST","path":"` + path + `","idempotency_key":"` + key + `","body":` + body + `}`
	id := b.agent.Post("/v1/approvals", req, apitest.Key("approval-"+key)).Status(t, http.StatusCreated).Str(t, "id")
	b.approver.Post("/v1/approvals/"+id+"/approve", nil).Status(t, http.StatusOK)
	return apitest.Header("Approval-Id", id)
}

// testApprovalsFailClosed: a currency the thresholds do not list needs approval for any amount; refunds are
// weighed by their running total, so a large refund split into small ones still needs approval; an approval
// past its expiry reads expired.
func testApprovalsFailClosed(t *testing.T, h *harness) {
	b := h.setup(t)
	sek := b.createIntent(t, "o-sek", `{"order_id":"o-sek","amount_minor":9007199254740991,"currency":"SEK"}`)
	r := b.agent.Post("/v1/payment_intents/"+sek.ID+"/capture", `{"amount_minor":1}`, apitest.Key("sek")).Status(t, http.StatusPreconditionRequired)
	if code(t, r) != "approval_required" {
		t.Fatalf("capture in an unlisted currency: %s", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1})

	in := b.createIntent(t, "o-split", `{"order_id":"o-split","amount":"2500.00","currency":"USD"}`)
	capture := "/v1/payment_intents/" + in.ID + "/capture"
	b.agent.Post(capture, `{}`, apitest.Key("cap"), b.approval(t, capture, "cap", `{}`)).Status(t, http.StatusOK)
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	// 600.00 alone is below the 1,000.00 threshold; a second 600.00 makes the total 1,200.00.
	b.agent.Post(refunds, `{"amount":"600.00"}`, apitest.Key("rf-1")).Status(t, http.StatusCreated)
	r = b.agent.Post(refunds, `{"amount":"600.00"}`, apitest.Key("rf-2")).Status(t, http.StatusPreconditionRequired)
	if code(t, r) != "approval_required" {
		t.Fatalf("second split refund: %s", r.Body)
	}
	b.assertCounters(t, map[string]int64{"authorize": 2, "capture": 1, "refund": 1})
	// The approver sees the running total.
	req := `{"method":"POST","path":"` + refunds + `","idempotency_key":"rf-2","body":{"amount":"600.00"}}`
	apv := b.agent.Post("/v1/approvals", req, apitest.Key("apv-rf-2")).Status(t, http.StatusCreated).JSON(t)
	if summary := apv["summary"].(map[string]any); summary["refunded_before"] != "600.00" || summary["refunded_total"] != "1200.00" ||
		!strings.HasPrefix(fmt.Sprint(summary["paid_to"]), "the payer of order o-split: the payer's card, provider authorization ") ||
		!strings.HasPrefix(fmt.Sprint(summary["paid_from"]), "account ") {
		t.Errorf("refund approval summary: %v; want who is paid and from what", summary)
	}
	// A capture's card says who is paid (the account) and from what (the payer's authorized card).
	req = `{"method":"POST","path":"/v1/payment_intents/` + sek.ID + `/capture","idempotency_key":"sek","body":{"amount_minor":1}}`
	card := b.agent.Post("/v1/approvals", req, apitest.Key("apv-sek")).Status(t, http.StatusCreated).JSON(t)["summary"].(map[string]any)
	if !strings.HasPrefix(fmt.Sprint(card["paid_to"]), "account ") || !strings.HasPrefix(fmt.Sprint(card["paid_from"]), "the payer's card, provider authorization ") {
		t.Errorf("capture approval summary: %v; want who is paid and from what", card)
	}
	id := apv["id"].(string)
	b.approver.Post("/v1/approvals/"+id+"/approve", nil).Status(t, http.StatusOK)
	b.agent.Post(refunds, `{"amount":"600.00"}`, apitest.Key("rf-2"), apitest.Header("Approval-Id", id)).Status(t, http.StatusCreated)
	b.assertCounters(t, map[string]int64{"authorize": 2, "capture": 1, "refund": 2})

	// The refunds list pages (and so does the list of operations under a key).
	var first, second struct {
		Items      []struct{ ID string }
		NextCursor *string `json:"next_cursor"`
	}
	b.agent.Get(refunds+"?limit=1").Status(t, http.StatusOK).Decode(t, &first)
	if len(first.Items) != 1 || first.NextCursor == nil {
		t.Fatalf("first page of refunds: %+v", first)
	}
	b.agent.Get(refunds+"?limit=1&cursor="+*first.NextCursor).Status(t, http.StatusOK).Decode(t, &second)
	if len(second.Items) != 1 || second.NextCursor != nil || second.Items[0].ID == first.Items[0].ID {
		t.Fatalf("second page of refunds: %+v after %+v", second, first)
	}
	var ops struct {
		Items      []struct{ ID string }
		NextCursor *string `json:"next_cursor"`
	}
	b.agent.Get("/v1/operations?idempotency_key=rf-1&limit=1").Status(t, http.StatusOK).Decode(t, &ops)
	if len(ops.Items) != 1 || ops.NextCursor != nil {
		t.Fatalf("operations of rf-1: %+v", ops)
	}

	// Expired: pending, or approved and unused, past expires_at.
	pending := b.agent.Post("/v1/approvals", strings.Replace(req, "rf-2", "rf-3", 1), apitest.Key("apv-rf-3")).Status(t, http.StatusCreated).Str(t, "id")
	if err := b.db.DB.Exec(`UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = ?`, pending).Error; err != nil {
		t.Fatal(err)
	}
	if state := b.agent.Get("/v1/approvals/"+pending).Status(t, http.StatusOK).Str(t, "state"); state != "expired" {
		t.Errorf("an expired approval reads %q", state)
	}
	if state := b.agent.Get("/v1/approvals/"+id).Status(t, http.StatusOK).Str(t, "state"); state != "approved" {
		t.Errorf("a used approval reads %q", state)
	}
}

// testConcurrentSmallRefunds: refunds sent at once, each below the threshold and together above it, cannot
// all pass without approval: the running total is read under the intent's lock.
func testConcurrentSmallRefunds(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-race", `{"order_id":"o-race","amount":"2500.00","currency":"USD"}`)
	capture := "/v1/payment_intents/" + in.ID + "/capture"
	b.agent.Post(capture, `{}`, apitest.Key("cap"), b.approval(t, capture, "cap", `{}`)).Status(t, http.StatusOK)
	results := race(8, func(i int) *apitest.Response {
		return b.agent.Post("/v1/payment_intents/"+in.ID+"/refunds", `{"amount":"300.00"}`, apitest.Key(fmt.Sprintf("rf-%d", i)))
	})
	created := 0
	for _, r := range results {
		switch r.Code {
		case http.StatusCreated:
			created++
		case http.StatusPreconditionRequired:
		default:
			t.Errorf("refund: %d %s", r.Code, r.Body)
		}
	}
	// 3 x 300.00 = 900.00 fits under 1,000.00; a fourth would make 1,200.00.
	if created != 3 {
		t.Errorf("%d refunds of 300.00 passed without approval, want 3", created)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": int64(created)})
}
