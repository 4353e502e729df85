package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// Fingerprint is SHA-256 over the RFC 8785 canonical JSON of the method, the route template, its path
// parameters, the account and the validated command (defaults applied, amounts in minor units), in lowercase hex.
// The path parameters are part of it because the template alone does not say which resource is acted on: one key
// used to capture two different intents must be a conflict, not a replay. Two requests that mean the same
// thing have one fingerprint whatever their key order, spacing or equivalent spelling of an amount.
//
// The command is marshalled by encoding/json first, so the canonicalizer only ever sees complete, valid JSON:
// some canonicalizers accept truncated input, and a fingerprint of half a request would be worse than none.
func Fingerprint(method, route string, params map[string]string, accountID string, command any) (string, error) {
	if params == nil {
		params = map[string]string{}
	}
	raw, err := json.Marshal(struct {
		Method    string            `json:"method"`
		Route     string            `json:"route"`
		Params    map[string]string `json:"params"`
		AccountID string            `json:"account_id"`
		Command   any               `json:"command"`
	}{method, route, params, accountID, command})
	if err != nil {
		return "", fmt.Errorf("idem: fingerprint: %w", err)
	}
	if !json.Valid(raw) {
		return "", fmt.Errorf("idem: fingerprint: command is not valid JSON")
	}
	canonical, err := auditchain.Canonical(json.RawMessage(raw))
	if err != nil {
		return "", fmt.Errorf("idem: fingerprint: canonicalize: %w", err)
	}
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:]), nil
}
