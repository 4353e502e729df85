package idem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// send posts body to url with key and the given lineage headers.
func send(url, key, body string, headers map[string]string) answer {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+servicetest.AgentSecret)
	req.Header.Set("Idempotency-Key", key)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(raw), err: err}
}

// TestLineageCannotBeForged: only a recorded attempt of the operation that was not itself refused can be a
// parent (not a conflicting request's attempt, not another operation's, not the attempt itself), an attempt id
// is used once per operation, Supersedes-Operation-Id names an operation of the same kind not superseded yet, and
// a Supersedes that cannot apply (on a key that exists) is refused, never dropped.
func TestLineageCannotBeForged(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	route := func(kind string) gin.HandlerFunc {
		return func(c *gin.Context) {
			var body map[string]any
			_ = c.ShouldBindJSON(&body)
			idemgin.Do(env.Idem, c, idem.Request{Kind: kind, Command: body},
				func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
					return idem.Result{Status: http.StatusCreated, Body: map[string]string{"op": op.ID}}, nil
				})
		}
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/notes", route("test.note")); api.POST("/tasks", route("test.task")) }))
	notes, tasks := env.URL+"/notes", env.URL+"/tasks"
	refused := func(what string, a answer, header string) {
		t.Helper()
		if a.err != nil || a.status != http.StatusBadRequest || !strings.Contains(a.body, `"header":"`+header+`"`) {
			t.Fatalf("%s: %d %s (%v); want 400 naming %s", what, a.status, a.body, a.err, header)
		}
	}
	first := send(notes, "k1", `{"n":1}`, map[string]string{"Attempt-Id": "att_a1"})
	conflict := send(notes, "k1", `{"n":2}`, map[string]string{"Attempt-Id": "att_a2"})
	other := send(notes, "k2", `{"n":1}`, map[string]string{"Attempt-Id": "att_b1"})
	if first.status != http.StatusCreated || conflict.status != http.StatusUnprocessableEntity || other.status != http.StatusCreated {
		t.Fatalf("setup: %d, %d, %d", first.status, conflict.status, other.status)
	}
	refused("parent refused as a conflict", send(notes, "k1", `{"n":1}`, map[string]string{"Attempt-Id": "att_a3", "Retry-Of": "att_a2"}), "Retry-Of")
	refused("parent of another operation", send(notes, "k1", `{"n":1}`, map[string]string{"Attempt-Id": "att_a4", "Retry-Of": "att_b1"}), "Retry-Of")
	refused("parent is itself", send(notes, "k1", `{"n":1}`, map[string]string{"Attempt-Id": "att_a5", "Retry-Of": "att_a5"}), "Retry-Of")
	refused("attempt id used twice", send(notes, "k1", `{"n":1}`, map[string]string{"Attempt-Id": "att_a1", "Retry-Of": "att_a1"}), "Retry-Of")
	if a := send(notes, "k1", `{"n":1}`, map[string]string{"Attempt-Id": "att_a6", "Retry-Of": "att_a1", "Retry-Reason": "destination_5xx"}); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a true retry: %d %s; want the replay", a.status, a.body)
	}
	refused("a used attempt id as a new attempt", send(notes, "k1", `{"n":1}`, map[string]string{"Attempt-Id": "att_a6", "Retry-Of": "att_a1"}), "Attempt-Id")

	firstOp := first.header.Get("Operation-Id")
	refused("superseding another kind", send(tasks, "k3", `{"n":1}`, map[string]string{"Supersedes-Operation-Id": firstOp}), "Supersedes-Operation-Id")
	if a := send(notes, "k4", `{"n":3}`, map[string]string{"Supersedes-Operation-Id": firstOp}); a.status != http.StatusCreated {
		t.Fatalf("superseding: %d %s", a.status, a.body)
	}
	refused("superseding twice", send(notes, "k5", `{"n":4}`, map[string]string{"Supersedes-Operation-Id": firstOp}), "Supersedes-Operation-Id")
	otherOp := other.header.Get("Operation-Id")
	refused("a replay naming what its claim did not supersede", send(notes, "k4", `{"n":3}`, map[string]string{"Supersedes-Operation-Id": otherOp}), "Supersedes-Operation-Id")
	// An operation whose outcome is unknown cannot be superseded: its effect may still have happened.
	if _, err := opstatus.Transition(t.Context(), env.DB.Pool, servicetest.AccountDemo, otherOp, opstatus.StateUnknown, "test",
		opstatus.From(opstatus.StateSucceeded)); err != nil {
		t.Fatal(err)
	}
	if a := send(notes, "k6", `{"n":5}`, map[string]string{"Supersedes-Operation-Id": otherOp}); a.status != http.StatusConflict ||
		!strings.Contains(a.body, `"code":"superseded_operation_unknown"`) {
		t.Fatalf("superseding an unknown operation: %d %s; want 409 superseded_operation_unknown", a.status, a.body)
	}
	var ops int64
	env.DB.Raw(`SELECT count(*) FROM operations`).Scan(&ops)
	if ops != 3 {
		t.Fatalf("%d operations; want 3 (k1, k2, k4): no refusal started one", ops)
	}
}
