package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
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
	Unrecorded int `json:"operations_without_key,omitempty"`
	// Confirmed lists what the services showed the new key, proving the account of each operation resume
	// would send again ("GET /v1/operations/op_..."); empty when there was none to prove.
	Confirmed []string `json:"confirmed_by,omitempty"`
	RunID     string   `json:"run_id"`
	At        string   `json:"at"`
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
		confirmed, err := a.confirmSameAccount(context.Background())
		if err != nil {
			return nil, err
		}
		return &principalAdopted{Type: RecPrincipalAdopted, Principal: a.principal, Previous: bound, Unrecorded: unrecorded,
			Confirmed: confirmed, RunID: a.runID, At: a.now()}, nil
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

// confirmSameAccount holds the operator's word (Config.SameAccount) to what the services say, before anything
// is sent under the new key. Every operation resume would send again that may have reached a service under
// another key must be shown to be of the new key's account: an operation the services hold is visible only to
// keys of its account. The proof is one operation made with the same key (any key id is one account) that the
// services return to the new key: by the operation id an answer gave (a 404 disproves it), or else by the
// operation's own idempotency key. An operation journaled without its key proves only itself. Anything less is
// refused with ErrOtherPrincipal and nothing sent: under another account's key the retry would find no record
// and do the effect again, there. It returns the requests that proved it.
func (a *Agent) confirmSameAccount(ctx context.Context) ([]string, error) {
	proven := map[string]bool{}
	var confirmed []string
	for _, op := range a.v.order {
		if op.Final() || neverSent(op) || op.Principal != nil && *op.Principal == a.principal {
			continue
		}
		group := "operation " + op.OperationID
		if op.Principal != nil {
			group = "key " + op.Principal.KeyID
		}
		if proven[group] {
			continue
		}
		endpoint, err := a.proveAccount(ctx, op)
		if err != nil {
			return nil, fmt.Errorf("%w: --same-account was given, but %v; nothing was sent. Use the key the operation "+
				"was made with; or, if it never reached the service, start the action again in another journal",
				ErrOtherPrincipal, err)
		}
		proven[group] = true
		confirmed = append(confirmed, endpoint)
	}
	return confirmed, nil
}

// proveAccount finds, under the agent's key, an operation made with op's key (op itself when its key is not
// recorded), and returns the request that found it.
func (a *Agent) proveAccount(ctx context.Context, op *Operation) (string, error) {
	var witnesses []*Operation
	for _, o := range a.v.order {
		if o == op || op.Principal != nil && o.Principal != nil && *o.Principal == *op.Principal {
			witnesses = append(witnesses, o)
		}
	}
	for _, w := range witnesses {
		route, id := a.operationsRoute(w), w.ServerOperationID()
		if route == "" || id == "" {
			continue
		}
		endpoint := route + "/" + url.PathEscape(id)
		var it operationView
		status, err := a.get(ctx, a.baseURL(w.Service)+endpoint, &it)
		switch {
		case status == http.StatusNotFound:
			return "", fmt.Errorf("this key does not see operation %s (action %s), which the journal's key made: "+
				"it is of another account", id, w.ActionID)
		case err != nil:
			return "", fmt.Errorf("operation %s (action %s) could not be read under this key (%v)", id, w.ActionID, err)
		}
		return "GET " + endpoint, nil
	}
	route := a.operationsRoute(op)
	if route != "" && op.IdempotencyKey != "" {
		endpoint := route + "?idempotency_key=" + url.QueryEscape(op.IdempotencyKey)
		var res struct {
			Items []operationView `json:"items"`
		}
		if _, err := a.get(ctx, a.baseURL(op.Service)+endpoint, &res); err != nil {
			return "", fmt.Errorf("action %s's operation could not be looked up under this key (%v)", op.ActionID, err)
		}
		if len(res.Items) > 0 {
			return "GET " + endpoint, nil
		}
	}
	return "", fmt.Errorf("action %s may have reached its service, and nothing under this key shows that its account is "+
		"the one the action was sent in (the service has no record of it for this key)", op.ActionID)
}
