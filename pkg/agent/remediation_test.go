package agent_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// An operation the service settled duplicate_effect_confirmed needs a person, and the next step says how to
// correct it: a refund sent with Remediates-Operation-Id naming that operation. Nothing is sent again, whether
// the service says so at once (409) or after the agent polled an accepted operation (202).
func TestDuplicateEffectPointsToTheCorrection(t *testing.T) {
	t.Parallel()
	dup := `{"type":"about:blank","status":409,"code":"duplicate_effect_confirmed","remote_ids":["ref_1","ref_2"]}`
	for name, tc := range map[string]struct{ write, read http.HandlerFunc }{
		"409": {answerWith(http.StatusConflict, map[string]string{"Operation-Id": "op_dup"}, dup), nil},
		"202 then polled": {
			answerWith(http.StatusAccepted, map[string]string{"Operation-Id": "op_dup"}, `{"id":"op_dup","operation_id":"op_dup","state":"running"}`),
			answerWith(http.StatusOK, nil, `{"id":"op_dup","state":"duplicate_effect_confirmed"}`),
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newScripted(t, tc.write, tc.read)
			cfg := s.config()
			cfg.MaxWait = 5 * time.Second
			a := s.open(t, cfg)
			res, err := a.Do(t.Context(), "d", "create_ticket", ticketArgs("dup"), agent.DoOptions{})
			if err != nil || res.State != agent.StateNeedsHuman {
				t.Fatalf("Do = %+v, %v; want needs_human", res, err)
			}
			if !strings.Contains(res.NextStep, "Remediates-Operation-Id: op_dup") || !strings.Contains(res.NextStep, "refund") {
				t.Errorf("next step %q; want the correction naming op_dup", res.NextStep)
			}
			if n := len(s.sent()); n != 1 {
				t.Errorf("%d sends; want 1: a duplicate is never retried", n)
			}
		})
	}
}
