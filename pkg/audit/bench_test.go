package audit_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// BenchmarkSealBatch is what the sequencer computes in Go for a batch of 1,000 records (a create's claimed event
// and attempt record, 500 times): each record's hash, the hash of the entries and the seal's, signed.
func BenchmarkSealBatch(b *testing.B) {
	claim, _ := json.Marshal(map[string]any{"attempt_id": "att_01a235a1-4ee9-74c8-83eb-565c888926ba", "agent_run_id": "run-7",
		"client": "retrysafe-agent/1.0"})
	attempt, _ := json.Marshal(map[string]any{"attempt_id": "att_01a235a1-4ee9-74c8-83eb-565c888926ba", "outcome": "created",
		"status": 201, "fingerprint": "e373bee163b80022fbef50574128ea42f410274be39aba9469d8fd38be9d0ca8", "duration_ms": 3})
	at := auditchain.FormatTime(time.Date(2026, 12, 1, 21, 0, 0, 123456000, time.UTC))
	signer, _ := auditchain.ParseSigningKey("cmV0cnlzYWZlIGF1ZGl0IHRlc3Qgc2lnbmluZyBrZXk=")
	b.ReportAllocs()
	for b.Loop() {
		entries := make([]auditchain.Entry, 0, 1000)
		for i := range 500 {
			op := fmt.Sprintf("op_01a235a1-4ee9-74c8-83eb-%012d", i)
			for j, detail := range []json.RawMessage{claim, attempt} {
				h, err := auditchain.RecordHash(map[string]any{"account_id": "acct_demo", "actor": "agent:a81cfb3f2770", "created_at": at,
					"detail": detail, "from_state": nil, "operation_id": op, "to_state": "succeeded", "type": "completed"})
				if err != nil {
					b.Fatal(err)
				}
				entries = append(entries, auditchain.Entry{Table: "operation_events", ID: int64(2*i + j), AccountID: "acct_demo", Subject: op, Hash: h})
			}
		}
		through := map[string]auditchain.Position{"operation_events": {XID: "123456", ID: 999}}
		if _, err := auditchain.NextSeal(nil, time.Now(), entries, through, signer); err != nil {
			b.Fatal(err)
		}
	}
}
