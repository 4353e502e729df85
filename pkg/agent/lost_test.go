package agent_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// payWorld is the payments service on a test schema, the provider sandbox as a process of the binary, and an
// agent on a journal of the test.
type payWorld struct {
	env      *servicetest.Env
	provider *provider.Client
	a        *agent.Agent
}

func startPayWorld(t *testing.T) *payWorld {
	t.Helper()
	bin := proctest.Build(t)
	prov := proctest.Start(t, bin, []string{"provider"}, nil, "PROVIDER_ADDR")
	env := servicetest.New(t)
	client := provider.NewClientHTTP(prov.URL, "sk_test_"+strings.ReplaceAll(t.Name(), "/", "_"), apitest.HTTPClient(t, 10*time.Second))
	svc, err := payments.New(env.Deps, payments.Config{Provider: client, ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, svc)
	a, err := agent.Open(filepath.Join(t.TempDir(), "agent.journal"), agent.Config{
		PaymentsURL: env.URL, APIKey: servicetest.AgentSecret, AuthorityRef: "test:demo-agent", Warn: func(string) {},
		BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return &payWorld{env: env, provider: client, a: a}
}

// do makes an action that must succeed and returns the id its answer names.
func (w *payWorld) do(t *testing.T, action, tool, args string) (agent.Result, string) {
	t.Helper()
	res, err := w.a.Do(t.Context(), action, tool, json.RawMessage(args), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("%s: %+v, %v; want succeeded", action, res, err)
	}
	var b struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(res.Body, &b)
	return res, b.ID
}

// lose deletes what an asynchronous standby never received: the operations (with their events, keys and
// stored answers) and the intent. The provider keeps what it did.
func (w *payWorld) lose(t *testing.T, intentID string, serverOps ...string) {
	t.Helper()
	w.env.DB.Tampered() // the audit records of the lost operations go with them
	err := w.env.DB.Connection(func(conn *gorm.DB) error {
		if err := conn.Exec(`SET session_replication_role = replica`).Error; err != nil {
			return err
		}
		defer conn.Exec(`SET session_replication_role = origin`)
		for _, q := range []string{`DELETE FROM operation_events WHERE operation_id IN ?`, `DELETE FROM operations WHERE id IN ?`} {
			if err := conn.Exec(q, serverOps).Error; err != nil {
				return err
			}
		}
		return conn.Exec(`DELETE FROM payment_intents WHERE id = ?`, intentID).Error
	})
	if err != nil {
		t.Fatal(err)
	}
}

// intents are the payment intents of order: their status and captured amount.
func (w *payWorld) intents(t *testing.T, order string) []string {
	t.Helper()
	var rows []string
	if err := w.env.DB.Raw(`SELECT status || ' ' || captured_minor FROM payment_intents WHERE order_id = ?`, order).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	return rows
}

func (w *payWorld) assertProvider(t *testing.T, want map[string]int64) {
	t.Helper()
	got, err := w.provider.Counters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for kind, n := range want {
		if got[kind] != n {
			t.Errorf("provider executed %s %d times; want %d (all: %v)", kind, got[kind], n, got)
		}
	}
}

// kinds are the operation's observation kinds and attempt decisions, in journal order.
func kinds(op *agent.Operation) []string {
	var out []string
	for _, o := range op.Observations {
		out = append(out, o.Kind)
	}
	for _, at := range op.Attempts {
		out = append(out, at.Decision)
	}
	return out
}

// An asynchronous failover lost an acknowledged intent and its capture (their operations, keys and the intent),
// while the provider holds the authorization and the capture. Verify finds both operations gone (404), journals
// them lost and sends each again under its own key, the intent first, then the capture to the intent made
// again: one intent, captured, and the provider executed one authorization and one capture. A second Verify
// finds both present and sends nothing.
func TestVerifyRemakesLostIntentAndCapture(t *testing.T) {
	t.Parallel()
	w := startPayWorld(t)
	created, intentID := w.do(t, "intent", "create_payment_intent", `{"order_id":"o-lost","amount":"12.00","currency":"USD"}`)
	captured, _ := w.do(t, "capture", "capture_payment", `{"intent_id":"`+intentID+`"}`)
	w.lose(t, intentID, created.ServerOperationID, captured.ServerOperationID)

	checks, err := w.a.Verify(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(checks) != 2 || checks[0].ActionID != "intent" || checks[1].ActionID != "capture" {
		t.Fatalf("checks %+v; want the intent, then the capture", checks)
	}
	for _, c := range checks {
		if c.Record != agent.RecordLost || !c.Remade || c.Result.State != agent.StateSucceeded || c.LostServerOperationID == "" {
			t.Errorf("check %+v; want lost, made again, succeeded", c)
		}
	}
	var again struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(checks[1].Result.Body, &again)
	if got := w.intents(t, "o-lost"); len(got) != 1 || got[0] != "succeeded 1200" || again.ID == intentID {
		t.Fatalf("intents %v, capture of %s; want one intent made again, captured 1200", got, again.ID)
	}
	w.assertProvider(t, map[string]int64{"authorize": 1, "capture": 1})

	for _, action := range []string{"intent", "capture"} {
		op, _ := w.a.Operation(action)
		if k := kinds(op); !slices.Contains(k, agent.ObsLost) || !slices.Contains(k, "lost_send_again_same_key") {
			t.Errorf("%s journal %v; want operation_lost, then a send with the same key", action, k)
		}
		if last := op.Attempts[len(op.Attempts)-1]; last.RetryReason != agent.ReasonAcknowledgedLost {
			t.Errorf("%s last attempt %+v; want retry reason %s", action, last, agent.ReasonAcknowledgedLost)
		}
	}
	if op, _ := w.a.Operation("capture"); !strings.Contains(op.Path, again.ID) {
		t.Errorf("capture path %s; want the intent made again, %s", op.Path, again.ID)
	}

	checks, err = w.a.Verify(t.Context())
	if err != nil || len(checks) != 2 || checks[0].Record != agent.RecordPresent || checks[1].Record != agent.RecordPresent {
		t.Fatalf("second verify %+v, %v; want both present", checks, err)
	}
	w.assertProvider(t, map[string]int64{"authorize": 1, "capture": 1})
}

// A capture of an intent the service lost answers 404. The journal shows the intent acknowledged, and the
// service answers 404 for its operation too: the agent makes the intent again under its key first, then sends
// the capture under its own key to the intent made again. Never refused; one authorization, one capture. A
// capture of an intent no action of the journal made is refused as before.
func TestCaptureOfLostIntentRemakesTheIntentFirst(t *testing.T) {
	t.Parallel()
	w := startPayWorld(t)
	created, intentID := w.do(t, "intent", "create_payment_intent", `{"order_id":"o-gone","amount":"7.50","currency":"USD"}`)
	w.lose(t, intentID, created.ServerOperationID)

	res, err := w.a.Do(t.Context(), "capture", "capture_payment", json.RawMessage(`{"intent_id":"`+intentID+`"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("capture: %+v, %v; want succeeded on the intent made again", res, err)
	}
	if got := w.intents(t, "o-gone"); len(got) != 1 || got[0] != "succeeded 750" {
		t.Fatalf("intents %v; want one, captured 750", got)
	}
	w.assertProvider(t, map[string]int64{"authorize": 1, "capture": 1})
	intent, _ := w.a.Operation("intent")
	capture, _ := w.a.Operation("capture")
	if k := kinds(intent); !slices.Contains(k, agent.ObsLost) {
		t.Errorf("intent journal %v; want operation_lost", k)
	}
	if k := kinds(capture); !slices.Contains(k, agent.ObsDependencyRemade) || capture.Attempts[0].Finished.Status != http.StatusNotFound {
		t.Errorf("capture journal %v; want a 404, then dependency_remade", k)
	}

	res, err = w.a.Do(t.Context(), "capture-other", "capture_payment",
		json.RawMessage(`{"intent_id":"pi_00000000-0000-7000-8000-000000000000"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateRefused || res.HTTPStatus != http.StatusNotFound {
		t.Fatalf("capture of an unknown intent: %+v, %v; want refused 404", res, err)
	}
	w.assertProvider(t, map[string]int64{"authorize": 1, "capture": 1})
}

// A capture settled refused 404 while its intent was gone but the intent's operation was still there (as in
// journals written before the agent looked): once the service answers 404 for that operation too, Verify
// makes the intent again under its key and sends the refused capture again under its own, to the intent made
// again (dependency_lost). One authorization, one capture.
func TestVerifyRemakesACaptureRefusedForALostIntent(t *testing.T) {
	t.Parallel()
	w := startPayWorld(t)
	created, intentID := w.do(t, "intent", "create_payment_intent", `{"order_id":"o-refused","amount":"4.00","currency":"USD"}`)
	w.lose(t, intentID) // the intent only: its operation still answers, so the 404 is taken as it is
	res, err := w.a.Do(t.Context(), "capture", "capture_payment", json.RawMessage(`{"intent_id":"`+intentID+`"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateRefused || res.HTTPStatus != http.StatusNotFound {
		t.Fatalf("capture: %+v, %v; want refused 404 while the intent's operation is there", res, err)
	}
	w.lose(t, intentID, created.ServerOperationID)

	checks, err := w.a.Verify(t.Context())
	if err != nil || len(checks) != 2 || checks[0].Record != agent.RecordLost || checks[1].Record != agent.RecordDependencyLost ||
		!checks[0].Remade || !checks[1].Remade {
		t.Fatalf("checks %+v, %v; want the intent lost and made again, then the capture sent again", checks, err)
	}
	if got := w.intents(t, "o-refused"); len(got) != 1 || got[0] != "succeeded 400" {
		t.Fatalf("intents %v; want one, captured 400", got)
	}
	w.assertProvider(t, map[string]int64{"authorize": 1, "capture": 1})
}
