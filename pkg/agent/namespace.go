package agent

import (
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

// derivedKey is the idempotency key of actionID in namespace: "idk_" and 32 hex digits (128 bits) of SHA-256
// over both, each prefixed with its length, so no namespace and action id can spell another pair's input.
func derivedKey(namespace, actionID string) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "retrysafe agent idempotency key\n%d:%s%d:%s", len(namespace), namespace,
		len(actionID), actionID))
	return "idk_" + hex.EncodeToString(sum[:16])
}
