package audit_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
)

// TestNewOperationChainMatchesTrigger writes an operation's first records through the database's chaining
// trigger, then links the same content with audit.NewOperationChain: every seq, prev, hash and attempt number
// must be the trigger's. A writer that starts a chain itself (idem's local completion) therefore stores exactly
// the chain the trigger would have.
func TestNewOperationChainMatchesTrigger(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	err := db.Exec(`INSERT INTO operations (id, account_id, kind, state) VALUES ('op_match', 'acct_a', 'tickets.create', 'succeeded')`).Error
	if err != nil {
		t.Fatal(err)
	}
	details := []map[string]any{
		{"attempt_id": "att_1", "agent_run_id": "run <7> & é 😀"},
		{"attempt_id": "att_1", "outcome": "created", "status": 201, "fingerprint": "abc", "duration_ms": 12, "reason": "x"},
		{"attempt_id": "att_2", "outcome": "replayed", "status": 201, "nested": map[string]any{"b": []any{1, "2", nil}, "a": true}},
	}
	types := []string{"claimed", "completed", "replayed"}
	for i, d := range details {
		raw, _ := json.Marshal(d)
		if err := db.Exec(`INSERT INTO operation_events (operation_id, account_id, type, actor, detail) VALUES ('op_match', 'acct_a', ?, 'agent:a', ?::jsonb)`,
			types[i], string(raw)).Error; err != nil {
			t.Fatal(err)
		}
	}
	type row struct {
		Type, Actor, Detail string
		CreatedAt           time.Time
		Attempt             *int64
		ChainSeq            int64
		PrevHash, Hash      string
	}
	var stored []row
	if err := db.Raw(`SELECT type, actor, detail::text AS detail, created_at, attempt, chain_seq, prev_hash, hash
FROM operation_events WHERE operation_id = 'op_match' ORDER BY id`).Scan(&stored).Error; err != nil {
		t.Fatal(err)
	}
	if len(stored) != len(details) {
		t.Fatalf("%d records stored; want %d", len(stored), len(details))
	}
	events := make([]audit.OperationEvent, len(details))
	attempts := make([]bool, len(details))
	for i, d := range details {
		raw, _ := json.Marshal(d) // Go's own JSON text, as the writer sends it: canonicalized before hashing
		events[i] = audit.OperationEvent{OperationID: "op_match", AccountID: "acct_a", Type: types[i], Actor: "agent:a",
			Detail: raw, CreatedAt: stored[i].CreatedAt}
		attempts[i] = audit.IsAttempt(d)
	}
	links, n, err := audit.NewOperationChain(events, attempts)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%d attempts counted; want 2", n)
	}
	for i, l := range links {
		s := stored[i]
		if l.Seq != s.ChainSeq || l.PrevHash != s.PrevHash || l.Hash != s.Hash || !sameAttempt(l.Attempt, s.Attempt) {
			t.Errorf("record %d (%s): Go links seq %d attempt %v hash %s; the trigger stored seq %d attempt %v hash %s",
				i, s.Type, l.Seq, deref(l.Attempt), l.Hash, s.ChainSeq, deref(s.Attempt), s.Hash)
		}
	}
}

func sameAttempt(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}
