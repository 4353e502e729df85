package audit_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/audit"
)

// BenchmarkNewOperationChain is what a writer that links its records itself pays per request for the audit
// record: a claimed event and an attempt record, canonicalized and linked (idem's local completion of a create).
func BenchmarkNewOperationChain(b *testing.B) {
	state := "succeeded"
	claim, _ := json.Marshal(map[string]any{"attempt_id": "att_01a235a1-4ee9-74c8-83eb-565c888926ba", "agent_run_id": "run-7",
		"client": "retrysafe-agent/1.0"})
	attempt, _ := json.Marshal(map[string]any{"attempt_id": "att_01a235a1-4ee9-74c8-83eb-565c888926ba", "outcome": "created",
		"status": 201, "fingerprint": "e373bee163b80022fbef50574128ea42f410274be39aba9469d8fd38be9d0ca8", "duration_ms": 3})
	at := time.Date(2026, 12, 1, 21, 0, 0, 123456000, time.UTC)
	events := []audit.OperationEvent{
		{OperationID: "op_01a235a1-4ee9-74c8-83eb-565c888926ba", AccountID: "acct_demo", Type: "claimed", Actor: "agent:a81cfb3f2770",
			ToState: &state, Detail: claim, CreatedAt: at},
		{OperationID: "op_01a235a1-4ee9-74c8-83eb-565c888926ba", AccountID: "acct_demo", Type: "completed", Actor: "agent:a81cfb3f2770",
			ToState: &state, Detail: attempt, CreatedAt: at},
	}
	attempts := []bool{false, true}
	b.ReportAllocs()
	for b.Loop() {
		evs := append([]audit.OperationEvent(nil), events...)
		if _, _, err := audit.NewOperationChain(evs, attempts); err != nil {
			b.Fatal(err)
		}
	}
}
