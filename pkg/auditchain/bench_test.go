package auditchain_test

import (
	"encoding/json"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// BenchmarkRecordHash is what the sequencer and verify pay per stored record: an operation event as read back
// (its detail in jsonb's key order), canonicalized and hashed.
func BenchmarkRecordHash(b *testing.B) {
	body, _ := json.Marshal(map[string]any{
		"account_id": "acct_demo", "actor": "agent:a81cfb3f2770", "created_at": "2026-12-01T21:00:00.123456Z",
		"detail":     json.RawMessage(`{"status": 201, "outcome": "created", "attempt_id": "att_01a235a1-4ee9-74c8-83eb-565c888926ba", "duration_ms": 3, "fingerprint": "e373bee163b80022fbef50574128ea42f410274be39aba9469d8fd38be9d0ca8"}`),
		"from_state": nil, "operation_id": "op_01a235a1-4ee9-74c8-83eb-565c888926ba", "to_state": "succeeded", "type": "completed",
	})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := auditchain.RecordHash(json.RawMessage(body)); err != nil {
			b.Fatal(err)
		}
	}
}
