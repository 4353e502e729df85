package deploys_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// dispatches returns the deploy operation's dispatch records and its failed record, in chain order, as
// "type state reason token" lines.
func dispatches(t *testing.T, b *bundle, opID string) []string {
	t.Helper()
	var rows []struct {
		Type   string
		Detail string
	}
	if err := b.db.Raw(`SELECT type, detail::text AS detail FROM operation_events
WHERE operation_id = ? AND (type LIKE 'dispatch_%' OR type = 'failed') ORDER BY id`, opID).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		var d struct {
			State        string `json:"state"`
			Reason       string `json:"reason"`
			FencingToken *int64 `json:"fencing_token"`
		}
		if err := json.Unmarshal([]byte(r.Detail), &d); err != nil {
			t.Fatal(err)
		}
		token := "-"
		if d.FencingToken != nil {
			token = fmt.Sprint(*d.FencingToken)
		}
		out = append(out, strings.Join([]string{r.Type, or(d.State), or(d.Reason), token}, " "))
	}
	return out
}

func or(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func activations(t *testing.T, b *bundle, deployID string) (rows, calls int) {
	t.Helper()
	var r struct{ N, Calls int }
	if err := b.db.Raw(`SELECT count(*) AS n, coalesce(sum(calls), 0) AS calls FROM deploy_target_activations WHERE deploy_id = ?`,
		deployID).Scan(&r).Error; err != nil {
		t.Fatal(err)
	}
	return r.N, r.Calls
}

func chainIntact(t *testing.T, b *bundle, opID string) {
	t.Helper()
	rep, err := audit.Verify(context.Background(), testdb.Pool(t, b.db), audit.VerifyOptions{OperationID: opID})
	if err != nil || !rep.Intact() {
		t.Fatalf("chain of %s: %v %+v", opID, err, rep.Problems)
	}
}

// TestTargetNotReachedIsActivatedAgain: activations that never reach the target are recorded not_sent and sent
// again with the same fencing token; the deploy succeeds, never failed for it, and the target activated once,
// on one call.
func TestTargetNotReachedIsActivatedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	b.faults.Arm(deploys.FaultUnreachable, 2)
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("nr")).Status(t, 202))
	b.runOnce(t)

	got := decodeDeploy(t, b.agent.Get("/v1/deploys/"+d.ID).Status(t, 200))
	if got.State != deploys.StateSucceeded {
		t.Fatalf("deploy %s after two unreachable activations, want succeeded", got.State)
	}
	if n, calls := activations(t, b, d.ID); n != 1 || calls != 1 {
		t.Fatalf("target: %d activations, %d calls; want 1 and 1", n, calls)
	}
	want := []string{
		"dispatch_started - - 1", "dispatch_not_sent not_sent connection_refused 1",
		"dispatch_started - - 1", "dispatch_not_sent not_sent connection_refused 1",
		"dispatch_started - - 1", "dispatch_response_received response_received - 1",
	}
	if recs := dispatches(t, b, d.OperationID); fmt.Sprint(recs) != fmt.Sprint(want) {
		t.Fatalf("dispatch records:\n%s\nwant\n%s", strings.Join(recs, "\n"), strings.Join(want, "\n"))
	}
	if env := environment(t, b.agent, "staging"); env.Version != 1 || *env.CurrentDeployID != d.ID {
		t.Fatalf("environment: %+v", env)
	}
	chainIntact(t, b, d.OperationID)
}

// TestTargetActivationFailureFailsTheDeploy: the target answers that the activation failed: the dispatch is
// recorded execution_error (activation_failed), the deploy fails with that reason, nothing is activated, the
// environment is unchanged and its lock free for the next deploy.
func TestTargetActivationFailureFailsTheDeploy(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	b.faults.Arm(deploys.FaultActivationFails, 1)
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("fail")).Status(t, 202))
	b.runOnce(t)

	got := decodeDeploy(t, b.agent.Get("/v1/deploys/"+d.ID).Status(t, 200))
	if got.State != deploys.StateFailed {
		t.Fatalf("deploy %s after a failed activation, want failed", got.State)
	}
	if n, _ := activations(t, b, d.ID); n != 0 {
		t.Fatalf("target: %d activations of a failed activation, want 0", n)
	}
	want := []string{"dispatch_started - - 1", "dispatch_execution_error execution_error activation_failed 1", "failed - activation_failed 1"}
	if recs := dispatches(t, b, d.OperationID); fmt.Sprint(recs) != fmt.Sprint(want) {
		t.Fatalf("dispatch records:\n%s\nwant\n%s", strings.Join(recs, "\n"), strings.Join(want, "\n"))
	}
	var op opstatus.Operation
	b.agent.Get("/v1/operations/"+d.OperationID).Status(t, 200).Decode(t, &op)
	if op.State != opstatus.StateFailed {
		t.Fatalf("operation %s, want failed", op.State)
	}
	if env := environment(t, b.agent, "staging"); env.Version != 0 || env.CurrentDeployID != nil {
		t.Fatalf("environment after a failed activation: %+v", env)
	}
	chainIntact(t, b, d.OperationID)

	// The lock was released: the next deploy goes through, activated once.
	next := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(2)), apitest.Key("next")).Status(t, 202))
	b.runOnce(t)
	if n, calls := activations(t, b, next.ID); n != 1 || calls != 1 {
		t.Fatalf("next deploy: %d activations, %d calls; want 1 and 1", n, calls)
	}
}
