package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/auth"
)

// approverPost sends a write to the payments service as the demo approver and returns the decoded answer.
func (w *agentWorld) approverPost(t *testing.T, path, key, body string) map[string]any {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, w.env["PAYMENTS_URL"]+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+servicetest.ApproverSecret)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode >= 300 {
		t.Fatalf("POST %s: %d %v %v", path, res.StatusCode, out, err)
	}
	return out
}

// grantCaptures grants the demo agent key max captures for an hour and returns the grant's id.
func (w *agentWorld) grantCaptures(t *testing.T, key string, max int) string {
	t.Helper()
	p, _ := auth.Demo().Authenticate(servicetest.AgentSecret)
	body := fmt.Sprintf(`{"agent_key_id":%q,"kinds":["payments.capture"],"max_uses":%d,"expires_at":%q}`,
		p.KeyID, max, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	return w.approverPost(t, "/v1/grants", key, body)["id"].(string)
}

// TestAgentGrant: agent processes capture payments above the approval threshold under a grant a person gave
// (--grant), with no approval each. Each attempt's journal record names the grant, and so does the service's
// attempt record; after the approver revokes it the next capture stops needs_human grant_invalid, with nothing
// captured, and goes on with the same key once a new grant is given. `audit verify --journal` checks the
// journal's grant ids against the service's grant records, and fails when the service's record of a use is gone.
func TestAgentGrant(t *testing.T) {
	t.Parallel()
	w := startAgentWorld(t)
	journal := filepath.Join(t.TempDir(), "grant.journal")
	intent := func(n int) string {
		args := fmt.Sprintf(`{"order_id":"o-grant-%d","amount":"2000.00","currency":"USD"}`, n)
		res := w.runAgent(t, nil, "agent", "do", "--journal", journal, "--action", fmt.Sprintf("intent-%d", n), "create_payment_intent", args).result(t)
		var body struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(res.Body, &body) != nil || body.ID == "" {
			t.Fatalf("intent %d: %+v", n, res)
		}
		return body.ID
	}
	intents := map[int]string{}
	capture := func(n int, grant string) agentExit {
		if intents[n] == "" {
			intents[n] = intent(n)
		}
		return w.runAgent(t, nil, "agent", "do", "--journal", journal, "--grant", grant, "--action", fmt.Sprintf("capture-%d", n),
			"capture_payment", fmt.Sprintf(`{"intent_id":%q}`, intents[n]))
	}
	g := w.grantCaptures(t, "grant-a", 3)
	for n := 1; n <= 2; n++ {
		if e := capture(n, g); e.code != 0 || e.result(t).State != agent.StateSucceeded {
			t.Fatalf("capture %d under the grant: exit %d %s %s", n, e.code, e.stdout, e.stderr)
		}
	}
	w.approverPost(t, "/v1/grants/"+g+"/revoke", "", `{}`)
	e := capture(3, g)
	if r := e.result(t); e.code != exitNeedsHuman || r.Code != agent.CodeGrantInvalid || !strings.Contains(r.NextStep, "new grant") {
		t.Fatalf("capture under a revoked grant: exit %d %+v; want needs_human grant_invalid", e.code, r)
	}
	counters, err := w.provider.Counters(t.Context())
	if err != nil || counters["capture"] != 2 {
		t.Fatalf("provider captures %v %v; want 2", counters, err)
	}
	if n := grantRows(t, w, `SELECT count(*) FROM operation_events WHERE outcome = 'created' AND detail->>'grant_id' = ?`, g); n != 2 {
		t.Fatalf("%d attempt records of the service carry the grant; want 2", n)
	}

	g2 := w.grantCaptures(t, "grant-b", 1)
	if e = capture(3, g2); e.code != 0 {
		t.Fatalf("capture-3 with a new grant: exit %d %s %s", e.code, e.stdout, e.stderr)
	}
	if counters, err := w.provider.Counters(t.Context()); err != nil || counters["capture"] != 3 {
		t.Fatalf("provider captures %v %v; want 3", counters, err)
	}
	show := w.runAgent(t, nil, "agent", "show", "--journal", journal, "capture-3")
	if !strings.Contains(show.stdout, "grant "+g) || !strings.Contains(show.stdout, "grant "+g2) {
		t.Fatalf("show does not name the grants of the attempts:\n%s", show.stdout)
	}
	db := map[string]string{"DATABASE_URL": w.db.DSN}
	v := w.runAgent(t, db, "audit", "verify", "--journal", journal)
	if v.code != 0 || !strings.Contains(v.stdout, "4 attempts under 2 grants") || !strings.Contains(v.stdout, "GRANTS CONSISTENT") {
		t.Fatalf("audit verify --journal: exit %d\n%s%s", v.code, v.stdout, v.stderr)
	}
	w.db.Tampered()
	if err := w.db.DB.Exec(`ALTER TABLE grant_events DISABLE TRIGGER grant_events_append_only`).Error; err != nil {
		t.Fatal(err)
	}
	cut := w.db.DB.Exec(`DELETE FROM grant_events WHERE grant_id = ? AND type = 'used'`, g2).Error
	if err := w.db.DB.Exec(`ALTER TABLE grant_events ENABLE TRIGGER grant_events_append_only`).Error; err != nil || cut != nil {
		t.Fatal(err, cut)
	}
	v = w.runAgent(t, db, "audit", "verify", "--journal", journal)
	if v.code != 1 || !strings.Contains(v.stdout, "BROKEN") || !strings.Contains(v.stdout, g2) {
		t.Fatalf("audit verify --journal with a use record removed: exit %d\n%s", v.code, v.stdout)
	}
}

func grantRows(t *testing.T, w *agentWorld, q string, args ...any) int {
	t.Helper()
	var n int
	if err := w.db.DB.Raw(q, args...).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}
