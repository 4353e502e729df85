package audit

import (
	"encoding/json"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// Grant records (grant_events: granted, used, revoked) are the audit's own table's, read as approval records are.

const tableGrantEvents = "grant_events"

// grantRecord is the hashed content of a grant_events record.
type grantRecord struct {
	AccountID string          `json:"account_id"`
	Actor     string          `json:"actor"`
	CreatedAt string          `json:"created_at"`
	Detail    json.RawMessage `json:"detail"`
	GrantID   string          `json:"grant_id"`
	Type      string          `json:"type"`
}

// grantSource is the source of grant_events, sealed after operation_events and approval_events in a batch.
var grantSource = eventSource(tableGrantEvents, "grant_id", func(r recordRow) any {
	return grantRecord{AccountID: r.AccountID, Actor: r.Actor, CreatedAt: auditchain.FormatTime(r.CreatedAt),
		Detail: json.RawMessage(r.Detail), GrantID: r.Subject, Type: r.Type}
})
