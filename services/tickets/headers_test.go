package tickets_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
)

// TestHeadersThatCannotApplyAreRefused: a ticket corrects no operation, and takes only approvals that exist. A
// Remediates-Operation-Id is 400 naming it, on a new key and on one that already ran; an Approval-Id no approval
// of the account can be is 403 approval_invalid on a new key (on one that ran, the stored answer is replayed, as
// every write that takes approvals does): never dropped, and nothing is claimed, written or recorded.
func TestHeadersThatCannotApplyAreRefused(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	c.Post("/v1/tickets", ticketBody, apitest.Key("ran")).Status(t, http.StatusCreated)
	events := count(t, env, `SELECT count(*) FROM operation_events`)
	for _, key := range []string{"new", "ran"} {
		for _, tt := range []struct {
			header, value string
			status        int
			code          string
		}{
			{"Remediates-Operation-Id", "op_01a24f00-e473-7db3-9fb3-ebbcc5b1ae6b", http.StatusBadRequest, "invalid_request"},
		} {
			p := c.Post("/v1/tickets", ticketBody, apitest.Key(key), apitest.Header(tt.header, tt.value)).Status(t, tt.status).JSON(t)
			if p["code"] != tt.code || !strings.Contains(p["detail"].(string), tt.header) {
				t.Errorf("%s %s on key %s: %v; want %s naming it", tt.header, tt.value, key, p, tt.code)
			}
			if tt.code == "invalid_request" && p["header"] != tt.header {
				t.Errorf("%s on key %s: %v; want header %s", tt.header, key, p, tt.header)
			}
		}
	}
	for _, id := range []string{"garbage", "apv_01a24f00-e473-7db3-9fb3-ebbcc5b1ae6b"} {
		p := c.Post("/v1/tickets", ticketBody, apitest.Key("new"), apitest.Header("Approval-Id", id)).Status(t, http.StatusForbidden).JSON(t)
		if p["code"] != "approval_invalid" {
			t.Errorf("Approval-Id %s on a new key: %v; want approval_invalid", id, p)
		}
	}
	if n := count(t, env, `SELECT count(*) FROM operations`); n != 1 {
		t.Errorf("%d operations; want the one that ran", n)
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 1 {
		t.Errorf("%d tickets; want the one that ran", n)
	}
	if n := count(t, env, `SELECT count(*) FROM operation_events`); n != events {
		t.Errorf("%d records; want %d: a refused header records nothing", n, events)
	}
}
