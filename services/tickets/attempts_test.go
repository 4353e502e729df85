package tickets_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
)

type attemptRecord struct {
	Type    string
	Attempt int64
	Detail  map[string]any
}

// attempts returns the attempt records of an operation (events whose detail has an outcome), in order.
func attempts(t *testing.T, env *servicetest.Env, opID string) []attemptRecord {
	t.Helper()
	var rows []struct {
		Type    string
		Attempt int64
		Detail  string
	}
	if err := env.DB.Raw(`SELECT type, attempt, detail::text AS detail FROM operation_events_numbered WHERE operation_id = ? AND attempt IS NOT NULL ORDER BY seq`, opID).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := make([]attemptRecord, len(rows))
	for i, r := range rows {
		out[i].Type, out[i].Attempt = r.Type, r.Attempt
		if err := json.Unmarshal([]byte(r.Detail), &out[i].Detail); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestAttemptsAreRecordsWithLineage(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	first := c.Post("/v1/tickets", ticketBody, apitest.Key("lineage-1"), apitest.Header("Attempt-Id", "att_01"),
		apitest.Header("Agent-Run-Id", "run-7")).Status(t, http.StatusCreated)
	opID := first.Header.Get("Operation-Id")
	c.Post("/v1/tickets", ticketBody, apitest.Key("lineage-1"), apitest.Header("Attempt-Id", "att_02"),
		apitest.Header("Agent-Run-Id", "run-8"), apitest.Header("Retry-Of", "att_01"),
		apitest.Header("Retry-Reason", "response_lost_after_dispatch")).Status(t, http.StatusCreated)
	c.Post("/v1/tickets", `{"project":"ops","title":"changed its mind"}`, apitest.Key("lineage-1"),
		apitest.Header("Attempt-Id", "att_03"), apitest.Header("Retry-Of", "att_02"),
		apitest.Header("Retry-Reason", "operator_requested")).Status(t, http.StatusUnprocessableEntity)

	recs := attempts(t, env, opID)
	if len(recs) != 3 {
		t.Fatalf("want 3 attempt records, got %+v", recs)
	}
	want := []struct{ typ, id, outcome, run, retryOf string }{
		{"completed", "att_01", "created", "run-7", ""},
		{"replayed", "att_02", "replayed", "run-8", "att_01"},
		{"conflict_rejected", "att_03", "conflict_rejected", "", "att_02"},
	}
	for i, w := range want {
		d := recs[i].Detail
		if recs[i].Type != w.typ || d["attempt_id"] != w.id || d["outcome"] != w.outcome || recs[i].Attempt != int64(i+1) {
			t.Errorf("attempt %d: %s %v", i+1, recs[i].Type, d)
		}
		if run, _ := d["agent_run_id"].(string); run != w.run {
			t.Errorf("attempt %d: agent run %v", i+1, d["agent_run_id"])
		}
		if of, _ := d["retry_of"].(string); of != w.retryOf {
			t.Errorf("attempt %d: retry_of %v", i+1, d["retry_of"])
		}
		if _, ok := d["duration_ms"].(float64); !ok || d["fingerprint"] == nil || d["status"] == nil {
			t.Errorf("attempt %d lacks duration, fingerprint or status: %v", i+1, d)
		}
	}
	if recs[1].Detail["retry_reason"] != "response_lost_after_dispatch" {
		t.Errorf("retry reason %v", recs[1].Detail["retry_reason"])
	}
	conflict := recs[2].Detail
	if conflict["fingerprint"] == conflict["prior_fingerprint"] || conflict["prior_fingerprint"] != recs[0].Detail["fingerprint"] {
		t.Errorf("a changed request records both fingerprints: %v", conflict)
	}
	if conflict["status"] != float64(422) {
		t.Errorf("conflict status %v", conflict["status"])
	}

	// A Retry-Of naming no attempt of this operation is refused, and the refusal is recorded.
	res := c.Post("/v1/tickets", ticketBody, apitest.Key("lineage-1"), apitest.Header("Attempt-Id", "att_04"),
		apitest.Header("Retry-Of", "att_99"), apitest.Header("Retry-Reason", "destination_5xx")).Status(t, http.StatusBadRequest)
	if p := res.JSON(t); p["code"] != "invalid_request" || p["header"] != "Retry-Of" {
		t.Errorf("problem %v", p)
	}
	if recs := attempts(t, env, opID); len(recs) != 4 || recs[3].Detail["outcome"] != "refused" || recs[3].Detail["status"] != float64(400) {
		t.Errorf("refused attempt: %+v", recs[len(recs)-1])
	}
	servicetest.AuditIntact(t, env.DB.DB)
}

func TestLineageHeadersAreValidatedBeforeAnything(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	for _, tt := range []struct{ header, value string }{
		{"Agent-Run-Id", strings.Repeat("r", 129)},
		{"Agent-Run-Id", "run 7"},
		{"Retry-Reason", "because"},
		{"Retry-Of", "att_01"}, // on a new key: there is no earlier attempt to retry
		{"Attempt-Id", "att\u00e9"},
		{"Supersedes-Operation-Id", "op_does-not-exist"},
		{"Supersedes-Operation-Id", "tkt_1"},
	} {
		opts := []apitest.Option{apitest.Key("refused-" + tt.header), apitest.Header(tt.header, tt.value)}
		if tt.header == "Retry-Reason" {
			opts = append(opts, apitest.Header("Retry-Of", "att_01"))
		}
		res := c.Post("/v1/tickets", ticketBody, opts...).Status(t, http.StatusBadRequest)
		p := res.JSON(t)
		if p["code"] != "invalid_request" || !strings.Contains(fmt.Sprint(p["detail"]), tt.header) {
			t.Errorf("%s: %q: %v", tt.header, tt.value, p)
		}
	}
	if n := count(t, env, `SELECT count(*) FROM operations`); n != 0 {
		t.Errorf("a refused request invented %d operations", n)
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 0 {
		t.Errorf("a refused request created %d tickets", n)
	}
}

func TestSupersedesLinksBothOperations(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	old := c.Post("/v1/tickets", ticketBody, apitest.Key("intent-1")).Status(t, http.StatusCreated).Header.Get("Operation-Id")
	// Another account cannot name it.
	c.As(servicetest.OtherAgentSecret).Post("/v1/tickets", ticketBody, apitest.Key("intent-x"),
		apitest.Header("Supersedes-Operation-Id", old)).Status(t, http.StatusBadRequest)
	next := c.Post("/v1/tickets", `{"project":"ops","title":"Rotate staging certificate today"}`, apitest.Key("intent-2"),
		apitest.Header("Supersedes-Operation-Id", old)).Status(t, http.StatusCreated).Header.Get("Operation-Id")
	if n := count(t, env, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = 'superseded' AND detail->>'superseded_by' = ?`, old, next); n != 1 {
		t.Errorf("the replaced operation does not name its successor")
	}
	if n := count(t, env, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = 'completed' AND detail->>'supersedes_operation_id' = ?`, next, old); n != 1 {
		t.Errorf("the new operation does not name the one it replaces")
	}
	servicetest.AuditIntact(t, env.DB.DB)
}

// TestStormAttemptsAreAllRecorded: every copy of a storm is an attempt record, numbered without gaps, in one
// intact chain.
func TestStormAttemptsAreAllRecorded(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	const n = 60
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := c.Try("POST", "/v1/tickets", ticketBody, apitest.Key("storm-1"), apitest.Header("Attempt-Id", fmt.Sprintf("att_%02d", i)))
			if err != nil || res.Code != http.StatusCreated {
				t.Errorf("copy %d: %v %v", i, res, err)
			}
		})
	}
	wg.Wait()
	if got := count(t, env, `SELECT count(*) FROM tickets`); got != 1 {
		t.Fatalf("%d tickets", got)
	}
	var opID string
	env.DB.Raw(`SELECT id FROM operations`).Scan(&opID)
	recs := attempts(t, env, opID)
	if len(recs) != n {
		t.Fatalf("want %d attempt records, got %d", n, len(recs))
	}
	seen := map[string]bool{}
	for i, r := range recs {
		if r.Attempt != int64(i+1) {
			t.Fatalf("attempt numbers: record %d says %v", i, r.Attempt)
		}
		seen[r.Detail["attempt_id"].(string)] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct attempt ids", len(seen))
	}
	servicetest.AuditIntact(t, env.DB.DB)
}

func TestTimelineTellsTheStory(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	opID := c.Post("/v1/tickets", ticketBody, apitest.Key("story-1"), apitest.Header("Attempt-Id", "att_01"),
		apitest.Header("Agent-Run-Id", "run-1")).Status(t, http.StatusCreated).Header.Get("Operation-Id")
	c.Post("/v1/tickets", ticketBody, apitest.Key("story-1"), apitest.Header("Attempt-Id", "att_02"),
		apitest.Header("Agent-Run-Id", "run-2"), apitest.Header("Retry-Of", "att_01"),
		apitest.Header("Retry-Reason", "response_lost_after_dispatch")).Status(t, http.StatusCreated)
	c.Post("/v1/tickets", `{"project":"ops","title":"another plan"}`, apitest.Key("story-1"),
		apitest.Header("Attempt-Id", "att_03")).Status(t, http.StatusUnprocessableEntity)

	var tl struct {
		OperationID string `json:"operation_id"`
		State       string
		SettledBy   *string `json:"settled_by"`
		Entries     []struct {
			Category, Type, Outcome string
			Attempt                 *int
			AttemptID               string `json:"attempt_id"`
			RetryOf                 string `json:"retry_of"`
			RetryReason             string `json:"retry_reason"`
			SameFingerprint         *bool  `json:"same_fingerprint"`
			OffsetMS                int64  `json:"offset_ms"`
		}
		Chain struct {
			Intact  bool
			Records int
		}
	}
	c.Get("/v1/operations/"+opID+"/timeline").Status(t, http.StatusOK).Decode(t, &tl)
	if tl.OperationID != opID || tl.State != "succeeded" || tl.SettledBy == nil || !tl.Chain.Intact || tl.Chain.Records != len(tl.Entries) {
		t.Fatalf("timeline %+v", tl)
	}
	var got []string
	for _, e := range tl.Entries {
		s := e.Category + ":" + e.Type
		if e.Attempt != nil {
			s += fmt.Sprintf("#%d/%s/%s/%v", *e.Attempt, e.AttemptID, e.Outcome, *e.SameFingerprint)
		}
		if e.RetryOf != "" {
			s += "<-" + e.RetryOf + "(" + e.RetryReason + ")"
		}
		if e.OffsetMS < 0 {
			t.Errorf("entry %s before the first attempt: %d ms", s, e.OffsetMS)
		}
		got = append(got, s)
	}
	want := []string{
		"attempt:completed#1/att_01/created/true",
		"attempt:replayed#2/att_02/replayed/true<-att_01(response_lost_after_dispatch)",
		"attempt:conflict_rejected#3/att_03/conflict_rejected/false",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("timeline entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Another account sees nothing.
	c.As(servicetest.OtherAgentSecret).Get("/v1/operations/"+opID+"/timeline").Status(t, http.StatusNotFound)
	_ = env
}
