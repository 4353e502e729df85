package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// ErrOtherPrincipal is returned by Open when the journal's operations were made under another API key, or
// under a key the journal never recorded (a journal written before keys were recorded). Nothing is sent or
// written. Idempotency keys are scoped to an account: an operation resumed under a key of another account
// finds no record there and is done a second time, in that account.
var ErrOtherPrincipal = errors.New("agent: the journal belongs to another API key")

// Principal is who an agent acts as, as its journal records it: never the secret.
//
// The services tell a caller neither its account nor the id they give its key (theirs is keyed with a server
// secret), so the agent names its key itself: KeyID is the first 16 hex digits of SHA-256 over
// "retrysafe agent key id:" and the secret. A key belongs to one account, so one key id means one account;
// two ids may still be one account (a rotated key), which only the operator can say (Config.SameAccount).
type Principal struct {
	KeyID string `json:"key_id"`
}

func principalOf(secret string) Principal {
	sum := sha256.Sum256([]byte("retrysafe agent key id:" + secret))
	return Principal{KeyID: hex.EncodeToString(sum[:8])}
}

// principalAdopted binds the journal to a new key: the operator said it is of the account the journal's
// operations were made in (Config.SameAccount). Later runs with that key need no word from the operator.
type principalAdopted struct {
	Type      string     `json:"type"`
	Principal Principal  `json:"principal"`
	Previous  *Principal `json:"previous,omitempty"`
	// Unrecorded counts operations journaled without their key (a journal from before keys were recorded).
	Unrecorded int    `json:"operations_without_key,omitempty"`
	RunID      string `json:"run_id"`
	At         string `json:"at"`
}

// checkPrincipal decides whether this agent may act on the journal it read: a journal acts for one key, the
// one its operations were made with. Another key is refused unless the operator declared it of the same
// account; then the returned record, journaled by the caller, binds the journal to the new key.
func (a *Agent) checkPrincipal() (*principalAdopted, error) {
	bound, unrecorded := a.v.principal, a.v.unrecorded
	if unrecorded == 0 && (bound == nil || *bound == a.principal) {
		return nil, nil
	}
	if a.cfg.SameAccount {
		return &principalAdopted{Type: RecPrincipalAdopted, Principal: a.principal, Previous: bound, Unrecorded: unrecorded,
			RunID: a.runID, At: a.now()}, nil
	}
	const how = "Use the key they were made with, or another journal; if this key belongs to the same account " +
		"(a rotated key), say so (agent --same-account, Config.SameAccount)"
	if unrecorded > 0 {
		return nil, fmt.Errorf("%w: %d of its operations were journaled without the key they were made with, and "+
			"resumed under a key of another account they would happen again there; nothing was sent. %s",
			ErrOtherPrincipal, unrecorded, how)
	}
	return nil, fmt.Errorf("%w: its operations were made with key id %s, this agent's key has id %s; resumed under "+
		"another account's key they would happen again there. Nothing was sent. %s", ErrOtherPrincipal, bound.KeyID,
		a.principal.KeyID, how)
}
