package agent

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// An action's idempotency key is derived from a namespace and its action id, never drawn at random: two
// journals given one action (two agents, or a worker handed it by the run that planned it) send one key, and the
// service, which scopes keys to an account, dedupes what neither journal can see of the other.
//
// The namespace should be the account: it is the scope of the services' keys. But the services tell a caller
// neither its account nor their id for its key, so the default is what the agent does know, its key id
// (Principal): one key belongs to one account, so a namespace never spans two accounts, and agents sharing an
// API key converge with no setting. Agents of one account holding different keys (a worker given its own key, a
// rotated key) converge only when told one namespace (Config.Namespace, AGENT_NAMESPACE); unrelated agents that
// share a key and reuse action ids need namespaces of their own.
//
// The key is an HMAC under a secret of the namespace, not a plain hash: a namespace (a key id, shown by show) and
// an action id (often a readable name a model chose) are no secret, and a key anyone could compute from them
// could be claimed first, by a request or by a host's marker file named after it, to block or answer for the
// action. With the secret, only those who hold it can compute the key. The default namespace's secret is the API
// key itself, which every agent of that namespace holds; a namespace given explicitly (Config.Namespace) needs
// its secret given too (Config.NamespaceSecret, AGENT_NAMESPACE_SECRET), which every agent of the namespace is
// given: two journals of one namespace hold the same secret, so they still derive one key for one action.

// maxNamespace bounds Config.Namespace; it is journaled with every operation and shown by show.
const maxNamespace = 200

// checkNamespace refuses a namespace that is empty or longer than maxNamespace, or holds anything but printable
// ASCII: it is a setting an operator types and show prints, nothing else needs more.
func checkNamespace(ns string) error {
	if ns == "" || len(ns) > maxNamespace {
		return fmt.Errorf("agent: the namespace is 1 to %d characters", maxNamespace)
	}
	for i := 0; i < len(ns); i++ {
		if ns[i] < ' ' || ns[i] > '~' {
			return fmt.Errorf("agent: the namespace holds a character other than printable ASCII at byte %d", i)
		}
	}
	return nil
}

// minNamespaceSecret is the shortest Config.NamespaceSecret: 16 bytes, 128 bits if drawn at random.
const minNamespaceSecret = 16

// derivedKey is the idempotency key of actionID in namespace: "idk_" and 32 hex digits (128 bits) of
// HMAC-SHA256 under the namespace's secret over both, each prefixed with its length, so no namespace and action
// id can spell another pair's input.
func derivedKey(secret, namespace, actionID string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(fmt.Appendf(nil, "retrysafe agent idempotency key\n%d:%s%d:%s", len(namespace), namespace, len(actionID), actionID))
	return "idk_" + hex.EncodeToString(mac.Sum(nil)[:16])
}

// hasKeyed reports whether any tool sends an idempotency key (or names a host's marker by one).
func (c *Catalog) hasKeyed() bool {
	for _, t := range c.tools {
		if t.Keyed {
			return true
		}
	}
	return false
}
