package console_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

var resolveKeyInput = regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`)

// The operation page of an unknown operation lets an approver record a decision, behind the CSRF check, once
// per form; an agent key sees no form; the evidence is shown escaped.
func TestOperationPageRecordsADecision(t *testing.T) {
	t.Parallel()
	env, base := setup(t)
	op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct_demo", Kind: "test.effect", State: opstatus.StateUnknown}
	testdb.CreateOperation(t, env.DB.DB, op)
	path := "/console/operations/" + op.ID

	agent := newPerson(t, base)
	agent.signIn(servicetest.AgentSecret)
	if _, page := agent.do(http.MethodGet, path, nil); strings.Contains(page, `id="resolve"`) || !strings.Contains(page, `id="read-only"`) {
		t.Fatal("an agent key is offered the decision form")
	}
	res, _ := agent.do(http.MethodPost, path+"/resolution", url.Values{"csrf_token": {csrf(t, mustGet(t, agent, path))},
		"idempotency_key": {"k-agent"}, "state": {"failed"}, "evidence": {"x"}})
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("agent decision = %d; want 403", res.StatusCode)
	}

	p := newPerson(t, base)
	p.signIn(servicetest.ApproverSecret)
	page := mustGet(t, p, path)
	key := resolveKeyInput.FindStringSubmatch(page)
	if key == nil || !strings.Contains(page, `id="resolve"`) {
		t.Fatalf("no decision form for an approver on an unknown operation")
	}
	form := url.Values{"idempotency_key": {key[1]}, "state": {"failed"},
		"evidence": {"Bank statement: nothing taken.\n<script>alert(1)</script>"}}
	if res, _ := p.do(http.MethodPost, path+"/resolution", form); res.StatusCode != http.StatusForbidden {
		t.Fatalf("decision without CSRF token = %d; want 403", res.StatusCode)
	}
	bad := url.Values{"csrf_token": {csrf(t, page)}, "idempotency_key": {"k-bad"}, "state": {"failed"}, "evidence": {"a\u202eb"}}
	if res, body := p.do(http.MethodPost, path+"/resolution", bad); res.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "evidence") {
		t.Fatalf("bidi evidence = %d", res.StatusCode)
	}
	if n := decisions(t, env, op.ID); n != 0 {
		t.Fatalf("%d decisions after refused forms", n)
	}

	form.Set("csrf_token", csrf(t, page))
	res, after := p.do(http.MethodPost, path+"/resolution", form)
	if res.StatusCode != http.StatusOK || !strings.Contains(after, `id="done"`) || strings.Contains(after, "<script>alert") ||
		!strings.Contains(after, "&lt;script&gt;") && !strings.Contains(after, `\u003cscript\u003e`) {
		t.Fatalf("after the decision: %d, page escaped? %v", res.StatusCode, !strings.Contains(after, "<script>alert"))
	}
	// The same form sent again is the same decision (a replay), not a second one nor a 409.
	if res, _ := p.do(http.MethodPost, path+"/resolution", form); res.StatusCode != http.StatusOK {
		t.Fatalf("the same form again = %d; want the replay", res.StatusCode)
	}
	var state string
	env.DB.Raw(`SELECT state FROM operations WHERE id = ?`, op.ID).Scan(&state)
	if state != "failed" || decisions(t, env, op.ID) != 1 {
		t.Fatalf("operation %s with %d decisions; want failed with 1", state, decisions(t, env, op.ID))
	}
	servicetest.AuditIntact(t, env.DB.DB)
}

func mustGet(t *testing.T, p *person, path string) string {
	t.Helper()
	res, page := p.do(http.MethodGet, path, nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d", path, res.StatusCode)
	}
	return page
}

func decisions(t *testing.T, env *servicetest.Env, opID string) int64 {
	t.Helper()
	var n int64
	if err := env.DB.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = ?`, opID, opstore.EventOperatorDecision).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// A browser sends a textarea's line breaks as CRLF: the decision is recorded, with the evidence's lines
// joined by LF as the API would have stored them.
func TestDecisionFormTakesBrowserLineBreaks(t *testing.T) {
	t.Parallel()
	env, base := setup(t)
	op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct_demo", Kind: "test.effect", State: opstatus.StateUnknown}
	testdb.CreateOperation(t, env.DB.DB, op)
	path := "/console/operations/" + op.ID

	p := newPerson(t, base)
	p.signIn(servicetest.ApproverSecret)
	page := mustGet(t, p, path)
	key := resolveKeyInput.FindStringSubmatch(page)
	if key == nil {
		t.Fatal("no decision form for an approver on an unknown operation")
	}
	form := url.Values{"csrf_token": {csrf(t, page)}, "idempotency_key": {key[1]}, "state": {"failed"},
		"evidence": {"Bank statement: nothing taken.\r\nChecked by phone.\r\n"}}
	if res, body := p.do(http.MethodPost, path+"/resolution", form); res.StatusCode != http.StatusOK || !strings.Contains(body, `id="done"`) {
		t.Fatalf("decision with CRLF evidence = %d", res.StatusCode)
	}
	var evidence []string
	if err := env.DB.Raw(`SELECT detail->>'evidence' FROM operation_events WHERE operation_id = ? AND type = ?`,
		op.ID, opstore.EventOperatorDecision).Scan(&evidence).Error; err != nil {
		t.Fatal(err)
	}
	if want := "Bank statement: nothing taken.\nChecked by phone.\n"; len(evidence) != 1 || evidence[0] != want {
		t.Fatalf("recorded evidence %q; want one decision with %q", evidence, want)
	}
}
