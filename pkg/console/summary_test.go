package console

import (
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/approval"
)

func TestHeadline(t *testing.T) {
	t.Parallel()
	tests := []struct {
		summary approval.Summary
		want    string
	}{
		{approval.Summary{"action": "deploy", "service": "api", "environment": "production", "artifact": "reg/api@sha256:ab"},
			"Deploy api reg/api@sha256:ab to production"},
		{approval.Summary{"action": "rollback", "service": "api", "environment": "production", "commit_sha": "abc"},
			"Roll back api in production to abc"},
		{approval.Summary{"action": "capture", "amount": "2500.00", "currency": "USD", "intent_id": "pi_1", "order_id": "o-1"},
			"Capture 2500.00 USD of intent pi_1 (order o-1)"},
		{approval.Summary{"action": "refund", "amount": "10.00", "currency": "EUR", "intent_id": "pi_2", "order_id": "o-2"},
			"Refund 10.00 EUR of intent pi_2 (order o-2)"},
	}
	for _, tt := range tests {
		if got := headline(tt.summary); got != tt.want {
			t.Errorf("headline(%v) = %q; want %q", tt.summary, got, tt.want)
		}
	}
}

func TestDetailsSayWhetherItCanBeRolledBack(t *testing.T) {
	t.Parallel()
	yes := details(approval.Summary{"can_roll_back": true, "replaces_deploy_id": "dep_1"})
	no := details(approval.Summary{"can_roll_back": false, "replaces_deploy_id": nil})
	if yes[0].Value != "yes, to deploy dep_1" || !strings.HasPrefix(no[0].Value, "no") {
		t.Fatalf("rollback line: %+v / %+v", yes[0], no[0])
	}
	for _, f := range append(yes, no...) {
		if f.Label == "can_roll_back" {
			t.Fatal("the raw can_roll_back field is listed beside its sentence")
		}
	}
}

// A write that replaces an operation of unknown outcome says so first, with what is known of that operation.
func TestDetailsSayWhatTheWriteReplaces(t *testing.T) {
	t.Parallel()
	got := details(approval.Summary{"action": "refund", "supersedes": map[string]any{"operation_id": "op_1", "kind": "payments.refund",
		"state": "unknown", "dispatch_state": "sent_no_response", "reason": "connection_reset"}})
	if got[0].Label != "Replaces an operation that may or may not have happened" ||
		got[0].Value != "op_1 (payments.refund), unknown; its last dispatch: sent_no_response; reason: connection_reset" {
		t.Fatalf("first line %+v", got[0])
	}
	for _, f := range got {
		if f.Label == "supersedes" {
			t.Fatal("the raw supersedes field is listed beside its sentence")
		}
	}
}

// The card of a retry after an unknown outcome says what the replaced operation was meant to do and the planned
// recovery, right after the operation itself.
func TestDetailsSayTheOriginalIntentAndTheRecovery(t *testing.T) {
	t.Parallel()
	got := details(approval.Summary{"action": "refund", "supersedes": map[string]any{"operation_id": "op_1", "kind": "payments.refund",
		"state": "unknown", "dispatch_state": "sent_no_response", "reason": "connection_reset",
		"original_intent":  map[string]any{"kind": "payments.refund", "idempotency_key": "ref-1", "resource": "payment_intent pi_1"},
		"planned_recovery": "send this request as a new operation that supersedes op_1"}})
	if len(got) < 3 || got[1].Label != "Its original intent" || got[1].Value != "payments.refund under key ref-1, on payment_intent pi_1" ||
		got[2].Label != "Planned recovery" || got[2].Value != "send this request as a new operation that supersedes op_1" {
		t.Fatalf("the card: %+v", got)
	}
}

func TestApprovalCursorRoundTrips(t *testing.T) {
	t.Parallel()
	a := approval.Approval{ID: "apv_x_y", CreatedAt: time.Date(2026, 11, 30, 1, 2, 3, 456789000, time.UTC)}
	c, err := parseApprovalCursor(approvalCursor(a))
	if err != nil || c.ID != a.ID || !c.CreatedAt.Equal(a.CreatedAt) {
		t.Fatalf("cursor = %+v, %v", c, err)
	}
	if _, err := parseApprovalCursor("garbage"); err == nil {
		t.Fatal("a cursor the console did not issue was accepted")
	}
}

func TestDoneNoticeOnlySaysDecisions(t *testing.T) {
	t.Parallel()
	for q, want := range map[string]string{
		"approved apv_01a2-b": "approved apv_01a2-b", "revoked apv_x": "revoked apv_x",
		"wire money to acct 42": "", "approved <b>x</b>": "", "pending apv_x": "", "": "",
	} {
		if got := doneNotice(q); got != want {
			t.Errorf("doneNotice(%q) = %q; want %q", q, got, want)
		}
	}
}
