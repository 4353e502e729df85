package payments_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/provider"
)

// agentKeyID is the server's id of the demo agent key, as a grant names it.
func agentKeyID(t *testing.T) string {
	t.Helper()
	p, ok := auth.Demo().Authenticate(servicetest.AgentSecret)
	if !ok {
		t.Fatal("the demo agent key does not authenticate")
	}
	return p.KeyID
}

// grant creates a grant of kinds for the demo agent key, max uses, as the approver, and returns its id.
func (b *bundle) grant(t *testing.T, key string, max int, kinds ...string) string {
	t.Helper()
	raw, _ := json.Marshal(map[string]any{"agent_key_id": agentKeyID(t), "kinds": kinds, "max_uses": max,
		"expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
	g := b.approver.Post("/v1/grants", string(raw), apitest.Key(key)).Status(t, http.StatusCreated).JSON(t)
	if g["state"] != "active" || g["uses"] != float64(0) {
		t.Fatalf("new grant: %v", g)
	}
	return g["id"].(string)
}

func grantRefused(t *testing.T, r *apitest.Response, reason string) {
	t.Helper()
	r.Status(t, http.StatusForbidden)
	if code(t, r) != "grant_invalid" || r.Str(t, "reason") != reason {
		t.Fatalf("%s; want grant_invalid, reason %s", r.Body, reason)
	}
}

// testGrants: captures above the threshold need an approval each; a grant of payments.capture for the agent key,
// two uses, lets two of them run without one. Each use is a `used` record naming the operation and the attempt
// that sent it, and the attempt record carries the grant's id. A third capture finds it used up; a revoked or
// expired grant, one of another kind or another agent, stops the next capture before the provider is called.
// Only an approver grants and revokes, and the grants' records verify with the audit.
func testGrants(t *testing.T, h *harness) {
	b := h.setup(t)
	capture := func(n int, key, grant string) *apitest.Response {
		in := b.createIntent(t, fmt.Sprintf("o-g%d", n), fmt.Sprintf(`{"order_id":"o-g%d","amount":"2000.00","currency":"USD"}`, n))
		return b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key(key), apitest.Header(approval.HeaderGrantID, grant),
			apitest.Header("Attempt-Id", "att-"+key))
	}
	b.agent.Post("/v1/grants", `{}`, apitest.Key("agent-grants")).Status(t, http.StatusForbidden)
	g := b.grant(t, "grant-1", 2, "payments.capture")
	for i, key := range []string{"cap-g1", "cap-g2"} {
		r := capture(i+1, key, g).Status(t, http.StatusOK)
		op := r.Header.Get("Operation-Id")
		if n := b.count(t, `SELECT count(*) FROM grant_events WHERE grant_id = ? AND type = 'used' AND detail->>'operation_id' = ?
AND detail->>'attempt_id' = ? AND (detail->>'use')::int = ?`, g, op, "att-"+key, i+1); n != 1 {
			t.Fatalf("capture %d: %d used records naming operation %s and its attempt; want 1", i+1, n, op)
		}
		if n := b.count(t, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND outcome = 'created' AND detail->>'grant_id' = ?`,
			op, g); n != 1 {
			t.Fatalf("capture %d: the attempt record does not carry the grant id", i+1)
		}
		if n := b.count(t, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = 'grant_checked' AND detail->>'grant_id' = ?`,
			op, g); n != 1 {
			t.Fatalf("capture %d: no grant_checked event", i+1)
		}
	}
	b.assertCounters(t, map[string]int64{"authorize": 2, "capture": 2})
	grantRefused(t, capture(3, "cap-g3", g), "used_up")
	shown := b.agent.Get("/v1/grants/"+g).Status(t, http.StatusOK).JSON(t)
	if shown["state"] != "used_up" || shown["uses"] != float64(2) {
		t.Fatalf("the grant after two uses: %v", shown)
	}

	revoked := b.grant(t, "grant-2", 5, "payments.capture")
	capture(4, "cap-g4", revoked).Status(t, http.StatusOK)
	b.agent.Post("/v1/grants/"+revoked+"/revoke", nil).Status(t, http.StatusForbidden)
	b.approver.Post("/v1/grants/"+revoked+"/revoke", nil).Status(t, http.StatusOK)
	b.approver.Post("/v1/grants/"+revoked+"/revoke", `{}`).Status(t, http.StatusOK) // a declared state: once
	grantRefused(t, capture(5, "cap-g5", revoked), "revoked")

	expired := b.grant(t, "grant-3", 5, "payments.capture")
	if err := b.db.Exec(`UPDATE grants SET expires_at = now() - interval '1 second' WHERE id = ?`, expired).Error; err != nil {
		t.Fatal(err)
	}
	grantRefused(t, capture(6, "cap-g6", expired), "expired")
	grantRefused(t, capture(7, "cap-g7", b.grant(t, "grant-4", 5, "payments.refund")), "other_kind")
	grantRefused(t, capture(8, "cap-g8", "grt_00000000-0000-0000-0000-000000000000"), "not_found")
	in := b.createIntent(t, "o-g9", `{"order_id":"o-g9","amount":"2000.00","currency":"USD"}`)
	other := b.grant(t, "grant-5", 5, "payments.capture")
	grantRefused(t, b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap-g9"),
		apitest.Header(approval.HeaderGrantID, other), b.approval(t, "/v1/payment_intents/"+in.ID+"/capture", "cap-g9", `{}`)), "with_approval")
	// A write that takes no approval takes no grant.
	b.agent.Post("/v1/payment_intents", `{"order_id":"o-g10","amount":"1.00","currency":"USD"}`, apitest.Key("create-g10"),
		apitest.Header(approval.HeaderGrantID, other)).Status(t, http.StatusForbidden)

	b.assertCounters(t, map[string]int64{"authorize": 9, "capture": 3})
	if n := b.count(t, `SELECT count(*) FROM grant_events WHERE grant_id = ? AND type = 'revoked' AND actor LIKE 'approver:%'`, revoked); n != 1 {
		t.Fatalf("%d revoked records; want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM grant_events WHERE type = 'used'`); n != 3 {
		t.Fatalf("%d used records; want 3: a refused write uses nothing", n)
	}
	if n := b.count(t, `SELECT sum(uses) FROM grants`); n != 3 {
		t.Fatalf("grants count %d uses; want 3", n)
	}
	servicetest.AuditIntact(t, b.db.DB)

	// Sealed, a grant's record cannot change unseen: a revocation rewritten as another approver's is caught.
	testdb.SealAll(t, &audit.Sequencer{DB: b.db.Pool})
	b.db.Tampered()
	if err := b.db.Exec(`ALTER TABLE grant_events DISABLE TRIGGER grant_events_append_only`).Error; err != nil {
		t.Fatal(err)
	}
	tamper := b.db.Exec(`UPDATE grant_events SET actor = 'approver:mallory' WHERE grant_id = ? AND type = 'revoked'`, revoked).Error
	if err := b.db.Exec(`ALTER TABLE grant_events ENABLE TRIGGER grant_events_append_only`).Error; err != nil || tamper != nil {
		t.Fatal(err, tamper)
	}
	rep, err := audit.Verify(t.Context(), b.db.Pool, audit.VerifyOptions{})
	if err != nil || rep.Intact() || len(rep.Problems) != 1 || rep.Problems[0].Chain != revoked {
		t.Fatalf("audit verify after a grant record was changed: %v %+v; want one problem, of grant %s", err, rep.Problems, revoked)
	}
}

// testGrantNeverApprovesARetryAfterUnknown: a refund whose provider answer was lost is unknown. A grant of
// payments.refund covers small refunds, but a refund that supersedes the unknown one, sent under the grant, is
// refused 409 superseded_operation_unknown and takes no use: it needs an approval of its own request, whose card
// shows the unknown refund's original intent, its last dispatch state and the planned recovery.
func testGrantNeverApprovesARetryAfterUnknown(t *testing.T, h *harness) {
	b := h.setup(t)
	in := b.createIntent(t, "o-gu", `{"order_id":"o-gu","amount":"10.00","currency":"USD"}`)
	b.agent.Post("/v1/payment_intents/"+in.ID+"/capture", `{}`, apitest.Key("cap")).Status(t, http.StatusOK)
	if err := b.provider.InjectFault(t.Context(), provider.Fault{Kind: provider.KindRefund, Mode: provider.FaultDrop, Count: 1}); err != nil {
		t.Fatal(err)
	}
	refunds := "/v1/payment_intents/" + in.ID + "/refunds"
	b.agent.Post(refunds, `{"amount":"3.00"}`, apitest.Key("ref-lost")).Status(t, http.StatusAccepted)
	old := operation(t, b.agent, "ref-lost")
	if old.State != opstatus.StateUnknown {
		t.Fatalf("lost refund is %s; want unknown", old.State)
	}
	g := b.grant(t, "grant-u", 5, "payments.refund")
	const body = `{"amount":"2.00"}`
	sup := apitest.Header(idem.HeaderSupersedes, old.ID)
	r := b.agent.Post(refunds, body, sup, apitest.Key("ref-new"), apitest.Header(approval.HeaderGrantID, g)).Status(t, http.StatusConflict)
	if code(t, r) != "superseded_operation_unknown" {
		t.Fatalf("a replacement of an unknown refund under a grant: %s; want superseded_operation_unknown", r.Body)
	}
	if n := b.count(t, `SELECT uses FROM grants WHERE id = ?`, g); n != 0 {
		t.Fatalf("the refused replacement took %d uses of the grant", n)
	}
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 1})

	raw, _ := json.Marshal(map[string]any{"method": "POST", "path": refunds, "idempotency_key": "ref-new", "body": json.RawMessage(body),
		"supersedes_operation_id": old.ID})
	card := b.agent.Post("/v1/approvals", string(raw), apitest.Key("apv-sup")).Status(t, http.StatusCreated).JSON(t)
	prior, _ := card["summary"].(map[string]any)["supersedes"].(map[string]any)
	intent, _ := prior["original_intent"].(map[string]any)
	if prior["dispatch_state"] != "sent_no_response" || intent["kind"] != "payments.refund" || intent["idempotency_key"] != "ref-lost" ||
		prior["planned_recovery"] == nil {
		t.Fatalf("the card of the retry after an unknown outcome: %v; want the original intent, the last dispatch and the recovery", prior)
	}
	b.approver.Post("/v1/approvals/"+card["id"].(string)+"/approve", `{}`).Status(t, http.StatusOK)
	b.agent.Post(refunds, body, sup, apitest.Key("ref-new"), apitest.Header("Approval-Id", card["id"].(string))).Status(t, http.StatusCreated)
	b.assertCounters(t, map[string]int64{"authorize": 1, "capture": 1, "refund": 2})
	if n := b.count(t, `SELECT count(*) FROM grant_events WHERE grant_id = ? AND type = 'used'`, g); n != 0 {
		t.Fatalf("%d uses of the grant recorded; want 0", n)
	}
}
