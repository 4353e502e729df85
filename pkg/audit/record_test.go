package audit_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
)

// TestNewOperationChainMatchesTrigger writes an operation's records through the database's chaining trigger, then
// links the same content in Go: with audit.NewOperationChain from the start, and with
// audit.ContinueOperationChain from the head the chain had after each record. Every seq, prev, hash and attempt
// number must be the trigger's, and the attempt count the head row's. A writer that links records itself (idem's
// local completion, opstatus.GroupAppender) therefore stores exactly the chain the trigger would have.
func TestNewOperationChainMatchesTrigger(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	err := db.Exec(`INSERT INTO operations (id, account_id, kind, state) VALUES ('op_match', 'acct_a', 'tickets.create', 'succeeded')`).Error
	if err != nil {
		t.Fatal(err)
	}
	details := []any{
		map[string]any{"attempt_id": "att_1", "agent_run_id": "run <7> & é 😀"},
		map[string]any{"attempt_id": "att_1", "outcome": "created", "status": 201, "fingerprint": "abc", "duration_ms": 12, "reason": "x"},
		map[string]any{"attempt_id": "att_2", "outcome": "replayed", "status": 201, "nested": map[string]any{"b": []any{1, "2", nil}, "a": true}},
		map[string]any{"evidence": "provider says done", "outcome": "seen"},
		[]any{"outcome", "attempt_id"}, // jsonb's ? finds array elements: the trigger counts this one
		map[string]any{"attempt_id": "att_3", "outcome": "replayed", "status": 201},
	}
	types := []string{"claimed", "completed", "replayed", "reconciled", "replayed", "replayed"}
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
	var headAttempts int64
	if err := db.Raw(`SELECT attempts FROM audit_chain_heads WHERE account_id = 'acct_a' AND chain = 'op_match'`).Scan(&headAttempts).Error; err != nil {
		t.Fatal(err)
	}
	// events is the Go side of the records from index from on: new values each time, as linking fills in attempts.
	events := func(from int) ([]audit.OperationEvent, []bool) {
		var evs []audit.OperationEvent
		var attempts []bool
		for i := from; i < len(details); i++ {
			raw, _ := json.Marshal(details[i]) // Go's own JSON text, as the writer sends it: canonicalized before hashing
			evs = append(evs, audit.OperationEvent{OperationID: "op_match", AccountID: "acct_a", Type: types[i], Actor: "agent:a",
				Detail: raw, CreatedAt: stored[i].CreatedAt})
			attempts = append(attempts, isAttemptJSON(raw))
			if m, ok := details[i].(map[string]any); ok && audit.IsAttempt(m) != isAttemptJSON(raw) {
				t.Errorf("record %d: IsAttempt and the trigger's test disagree", i)
			}
		}
		return evs, attempts
	}
	check := func(name string, from int, links []audit.Link, n int64) {
		t.Helper()
		if n != headAttempts {
			t.Errorf("%s: %d attempts counted; the trigger's head has %d", name, n, headAttempts)
		}
		if len(links) != len(stored)-from {
			t.Fatalf("%s: %d links; want %d", name, len(links), len(stored)-from)
		}
		for i, l := range links {
			s := stored[from+i]
			if l.Seq != s.ChainSeq || l.PrevHash != s.PrevHash || l.Hash != s.Hash || !sameAttempt(l.Attempt, s.Attempt) {
				t.Errorf("%s: record %d (%s): Go links seq %d attempt %v hash %s; the trigger stored seq %d attempt %v hash %s",
					name, from+i, s.Type, l.Seq, deref(l.Attempt), l.Hash, s.ChainSeq, deref(s.Attempt), s.Hash)
			}
		}
	}

	evs, attempts := events(0)
	links, n, err := audit.NewOperationChain(evs, attempts)
	if err != nil {
		t.Fatal(err)
	}
	check("new chain", 0, links, n)

	// Continued from every head the chain had: after record k-1, with the attempts counted up to there.
	var attemptsBefore int64
	for k := 1; k < len(stored); k++ {
		if stored[k-1].Attempt != nil {
			attemptsBefore++
		}
		head := audit.Head{Seq: stored[k-1].ChainSeq, Hash: stored[k-1].Hash, Attempts: attemptsBefore}
		evs, attempts := events(k)
		links, n, err := audit.ContinueOperationChain(head, evs, attempts)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("continued after record %d", k-1), k, links, n)
	}
}

func sameAttempt(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// isAttemptJSON is the trigger's whole attempt test on a detail given as JSON text, by which the matching test
// numbers attempts and checks IsAttempt: jsonb's ? also finds a name among the strings of an array, so an array
// holding both names counts too. No writer links such details in Go, so it is the test's, not the package's.
func isAttemptJSON(detail json.RawMessage) bool {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(detail, &fields); err == nil {
		_, outcome := fields["outcome"]
		_, attempt := fields["attempt_id"]
		return outcome && attempt
	}
	var elems []any
	if err := json.Unmarshal(detail, &elems); err != nil {
		return false
	}
	var outcome, attempt bool
	for _, e := range elems {
		outcome = outcome || e == "outcome"
		attempt = attempt || e == "attempt_id"
	}
	return outcome && attempt
}
