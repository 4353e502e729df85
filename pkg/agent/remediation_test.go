package agent_test

import (
	"errors"
	"net/http"
	"path/filepath"
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

// A correction names the duplicate it corrects: the refund goes with Remediates-Operation-Id, and the journal
// keeps it with the operation, so show and a resume send the same. Only a refund takes it, only a new action,
// and only an operation id.
func TestRemediatesIsSentAndJournaled(t *testing.T) {
	t.Parallel()
	s := newScripted(t, answerWith(http.StatusCreated, map[string]string{"Operation-Id": "op_fix"}, `{"id":"re_2","returns_duplicate_capture":true}`), nil)
	path := filepath.Join(t.TempDir(), "agent.journal")
	a, err := agent.Open(path, s.config())
	if err != nil {
		t.Fatal(err)
	}
	args := []byte(`{"intent_id":"pi_1","amount":"10.00"}`)
	res, err := a.Do(t.Context(), "fix", "refund_payment", args, agent.DoOptions{Remediates: "op_dup"})
	if err != nil || res.State != agent.StateSucceeded || len(s.sent()) != 1 || s.sent()[0].Get("Remediates-Operation-Id") != "op_dup" {
		t.Fatalf("Do = %+v, %v; want one send with Remediates-Operation-Id op_dup", res, err)
	}
	for name, c := range map[string]struct {
		action, tool string
		args         []byte
		remediates   string
	}{
		"another tool":       {"t", "create_ticket", ticketArgs("x"), "op_dup"},
		"not an operation":   {"f2", "refund_payment", args, "re_1"},
		"an existing action": {"fix", "refund_payment", args, "op_other"},
	} {
		if _, err := a.Do(t.Context(), c.action, c.tool, c.args, agent.DoOptions{Remediates: c.remediates}); !errors.Is(err, agent.ErrBadArguments) {
			t.Errorf("%s: %v; want ErrBadArguments", name, err)
		}
	}
	if n := len(s.sent()); n != 1 {
		t.Errorf("%d sends; want the one correction", n)
	}
	a.Close()
	j, err := agent.ReadJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	if op, _ := j.Operation("fix"); op == nil || op.RemediatesServerOpID != "op_dup" {
		t.Errorf("journaled operation %+v; want it to name op_dup", op)
	}
}
