// Package ids makes the identifiers of retrysafe resources: a short type prefix and a time-ordered UUID (v7),
// so ids say what they name ("tkt_", "op_", "pi_") and sort by creation in indexes and logs.
//
//	id := ids.New("tkt_") // tkt_0193c1c5-...
package ids

import "github.com/google/uuid"

// New returns prefix followed by a new UUIDv7.
func New(prefix string) string {
	return prefix + uuid.Must(uuid.NewV7()).String()
}
