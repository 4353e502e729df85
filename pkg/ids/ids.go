// Package ids makes the identifiers of retrysafe resources: a short type prefix and a time-ordered UUID (v7),
// so ids say what they name ("tkt_", "op_", "pi_") and sort by creation in indexes and logs.
//
//	id := ids.New("tkt_")          // tkt_0193c1c5-...
//	ok := ids.Valid("tkt_", value) // what a handler asks before a value from a path reaches SQL
package ids

import (
	"context"
	"net/http"

	"github.com/google/uuid"
)

// New returns prefix followed by a new UUIDv7.
func New(prefix string) string {
	return prefix + uuid.Must(uuid.NewV7()).String()
}

// Valid reports whether s is an id New(prefix) could have made: the prefix, then a UUID in its canonical
// lowercase 36-character form. Anything else names nothing, so callers answer it as they answer a missing id.
func Valid(prefix string, s string) bool {
	if len(s) != len(prefix)+36 || s[:len(prefix)] != prefix {
		return false
	}
	rest := s[len(prefix):]
	for i := 0; i < len(rest); i++ {
		switch ch := rest[i]; {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if ch != '-' {
				return false
			}
		case (ch < '0' || ch > '9') && (ch < 'a' || ch > 'f'):
			return false
		}
	}
	return true
}

// HeaderAttemptID names one HTTP attempt. A caller may send its own (the agent's att_01, att_02 of one
// operation); otherwise the server makes one. It is echoed on the response, written in the access log and in
// the operation events the attempt causes, so an investigation can tell attempts of one action apart.
const HeaderAttemptID = "Attempt-Id"

// AttemptIDOf is the attempt id of a request with header h: its Attempt-Id when valid, or a new one.
func AttemptIDOf(h http.Header) string {
	if id := h.Get(HeaderAttemptID); ValidSent(id) {
		return id
	}
	return New("att_")
}

// ValidSent reports whether id is 1 to 128 printable ASCII characters without spaces: the form of an
// Attempt-Id, and of the other ids a caller sends in headers (package idem's lineage headers).
func ValidSent(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= 0x20 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

type attemptKey struct{}

// WithAttemptID returns ctx carrying the attempt id a router gave its request (httpserver's middleware echoes
// and logs it), so the handlers behind the router, and idem, name the attempt by that id, not another.
func WithAttemptID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, attemptKey{}, id)
}

// AttemptID is the attempt id of r: the one WithAttemptID put in its context, else AttemptIDOf(r.Header).
func AttemptID(r *http.Request) string {
	if id, ok := r.Context().Value(attemptKey{}).(string); ok {
		return id
	}
	return AttemptIDOf(r.Header)
}
