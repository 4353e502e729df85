package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// TestAgentVerifyCommand: an intent and its capture acknowledged, then lost with the database (their
// operations and the intent deleted, as by an asynchronous failover; the provider keeps its effects). `agent
// verify` prints both lost and made again and exits 7; the service has one intent, captured, and the provider
// one authorization and one capture. Run again, it finds both present and exits 0.
func TestAgentVerifyCommand(t *testing.T) {
	t.Parallel()
	w := startAgentWorld(t)
	journal := filepath.Join(t.TempDir(), "verify.journal")
	do := func(action, tool, args string) agent.Result {
		t.Helper()
		e := w.runAgent(t, nil, "agent", "do", "--journal", journal, "--action", action, tool, args)
		if e.code != 0 {
			t.Fatalf("%s: exit %d %s %s", action, e.code, e.stdout, e.stderr)
		}
		return e.result(t)
	}
	created := do("intent", "create_payment_intent", `{"order_id":"o-verify","amount":"3.00","currency":"USD"}`)
	var in struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(created.Body, &in)
	captured := do("capture", "capture_payment", `{"intent_id":"`+in.ID+`"}`)

	w.db.Tampered()
	err := w.db.Connection(func(conn *gorm.DB) error {
		conn.Exec(`SET session_replication_role = replica`)
		defer conn.Exec(`SET session_replication_role = origin`)
		ops := []string{created.ServerOperationID, captured.ServerOperationID}
		if err := conn.Exec(`DELETE FROM operation_events WHERE operation_id IN ?`, ops).Error; err != nil {
			return err
		}
		if err := conn.Exec(`DELETE FROM operations WHERE id IN ?`, ops).Error; err != nil {
			return err
		}
		return conn.Exec(`DELETE FROM payment_intents WHERE id = ?`, in.ID).Error
	})
	if err != nil {
		t.Fatal(err)
	}

	e := w.runAgent(t, nil, "agent", "verify", "--journal", journal)
	lines := strings.Split(strings.TrimSpace(e.stdout), "\n")
	if e.code != exitRemade || len(lines) != 2 || !strings.Contains(e.stderr, "intent, capture") {
		t.Fatalf("verify: exit %d\n%s\n%s; want 7, two checks", e.code, e.stdout, e.stderr)
	}
	for i, action := range []string{"intent", "capture"} {
		var c agent.Check
		if err := json.Unmarshal([]byte(lines[i]), &c); err != nil || c.ActionID != action || c.Record != agent.RecordLost || !c.Remade {
			t.Errorf("check %d: %s %v; want %s lost and made again", i, lines[i], err, action)
		}
	}
	var rows []string
	if err := w.db.Raw(`SELECT status || ' ' || captured_minor FROM payment_intents WHERE order_id = 'o-verify'`).Scan(&rows).Error; err != nil ||
		len(rows) != 1 || rows[0] != "succeeded 300" {
		t.Fatalf("intents %v %v; want one, captured 300", rows, err)
	}
	counters, err := w.provider.Counters(t.Context())
	if err != nil || counters["authorize"] != 1 || counters["capture"] != 1 {
		t.Fatalf("provider counters %v %v; want one authorization, one capture", counters, err)
	}

	e = w.runAgent(t, nil, "agent", "verify", "--journal", journal)
	if e.code != 0 || strings.Count(e.stdout, `"service_record":"present"`) != 2 {
		t.Fatalf("second verify: exit %d\n%s\n%s; want 0, both present", e.code, e.stdout, e.stderr)
	}
	e = w.runAgent(t, nil, "agent", "show", "--journal", journal, "capture")
	if !strings.Contains(e.stdout, "observation operation_lost") || !strings.Contains(e.stdout, "lost_send_again_same_key") {
		t.Errorf("show capture:\n%s\nwant operation_lost, then the send under the same key", e.stdout)
	}
}
