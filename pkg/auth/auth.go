// Package auth checks the bearer API keys of retrysafe and scopes every request to one account.
//
// Keys come from API_KEYS as comma-separated `account_id:role:secret` entries; role is `agent` or `approver`;
// a secret has at least MinSecretLength characters. Secrets are compared in constant time and never logged: a
// Principal carries a key id that logs, events and approvals show instead. The id is a keyed hash
// (HMAC-SHA256) of the secret under a server secret (API_KEY_ID_SECRET), so someone who sees ids, an agent
// reading who approved its request, cannot test guesses of a secret against them offline.
//
//	keys, _ := auth.ParseKeys(os.Getenv("API_KEYS"), os.Getenv("API_KEY_ID_SECRET"))
//	handler := auth.Middleware(keys)(mux) // gin: r.Use(httpserver.Wrap(auth.Middleware(keys)))
//	p := auth.From(r.Context())          // p.AccountID scopes every query
package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Role is what a key may do.
type Role string

const (
	RoleAgent    Role = "agent"
	RoleApprover Role = "approver"
)

// Principal is the authenticated caller.
type Principal struct {
	AccountID string
	Role      Role
	// KeyID identifies the key without revealing it: the first 12 hex digits of HMAC-SHA256(id secret, secret).
	KeyID string
}

// Actor is how operation events and approvals name the caller.
func (p Principal) Actor() string { return string(p.Role) + ":" + p.KeyID }

type key struct {
	principal Principal
	digest    [sha256.Size]byte
}

// Keys is the set of accepted API keys.
type Keys struct{ keys []key }

// DemoKeys is used when API_KEYS is unset, in development only; the README lists these secrets. They are
// shorter than MinSecretLength, which Demo alone allows.
const DemoKeys = "acct_demo:agent:demo-agent-secret,acct_demo:approver:demo-approver-secret," +
	"acct_other:agent:other-agent-secret,acct_other:approver:other-approver-secret"

// demoIDSecret keys the ids of the demo keys. It is public, as their secrets are.
const demoIDSecret = "retrysafe-demo-key-ids"

// MinSecretLength is the shortest secret ParseKeys accepts: 24 random characters are beyond guessing, offline
// or online.
const MinSecretLength = 24

// MinIDSecretLength is the shortest id secret ParseKeys accepts.
const MinIDSecretLength = 32

// Demo returns the demo keys (DemoKeys), for development and tests.
func Demo() *Keys {
	ks, err := parseKeys(DemoKeys, demoIDSecret, 1)
	if err != nil {
		panic(err) // a constant that does not parse is a bug
	}
	return ks
}

// ParseKeys parses API_KEYS. idSecret (API_KEY_ID_SECRET, at least MinIDSecretLength characters) keys the hash
// that makes key ids; every secret has at least MinSecretLength characters.
func ParseKeys(spec, idSecret string) (*Keys, error) {
	if len(idSecret) < MinIDSecretLength {
		return nil, fmt.Errorf("auth: the key id secret must have at least %d characters", MinIDSecretLength)
	}
	return parseKeys(spec, idSecret, MinSecretLength)
}

func parseKeys(spec, idSecret string, minSecret int) (*Keys, error) {
	ks := &Keys{}
	for _, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.SplitN(entry, ":", 3)
		if len(parts) != 3 || parts[0] == "" || parts[2] == "" {
			return nil, fmt.Errorf("auth: API_KEYS entry %d is not account_id:role:secret", len(ks.keys)+1)
		}
		role := Role(parts[1])
		if role != RoleAgent && role != RoleApprover {
			return nil, fmt.Errorf("auth: API_KEYS entry for account %q has role %q, want agent or approver", parts[0], parts[1])
		}
		if len(parts[2]) < minSecret {
			return nil, fmt.Errorf("auth: API_KEYS entry %d (account %q) has a secret shorter than %d characters", len(ks.keys)+1, parts[0], minSecret)
		}
		mac := hmac.New(sha256.New, []byte(idSecret))
		mac.Write([]byte(parts[2]))
		ks.keys = append(ks.keys, key{
			principal: Principal{AccountID: parts[0], Role: role, KeyID: hex.EncodeToString(mac.Sum(nil)[:6])},
			digest:    sha256.Sum256([]byte(parts[2])),
		})
	}
	if len(ks.keys) == 0 {
		return nil, fmt.Errorf("auth: API_KEYS has no entries")
	}
	return ks, nil
}

// Authenticate returns the principal of a secret. Every key is compared, in constant time, so the time taken
// does not tell which key came close.
func (ks *Keys) Authenticate(secret string) (Principal, bool) {
	digest := sha256.Sum256([]byte(secret))
	var found Principal
	ok := 0
	for _, k := range ks.keys {
		if subtle.ConstantTimeCompare(digest[:], k.digest[:]) == 1 {
			found = k.principal
			ok = 1
		}
	}
	return found, ok == 1
}

// principalKey is the request context key of the authenticated Principal.
type principalKey struct{}

// Middleware rejects requests without a known bearer key (401) and puts the Principal in the request context
// for From. The 401 is answered before the body is read, and closes the connection (problem.CloseUnread): a
// client without a key cannot hold a connection by sending a body slowly.
func Middleware(ks *Keys) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			secret, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !found || secret == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="retrysafe"`)
				problem.CloseUnread(w, r)
				problem.Write(w, r, problem.New("unauthorized", "send Authorization: Bearer <api key>"))
				return
			}
			p, ok := ks.Authenticate(secret)
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="retrysafe", error="invalid_token"`)
				problem.CloseUnread(w, r)
				problem.Write(w, r, problem.New("unauthorized", "unknown API key"))
				return
			}
			next.ServeHTTP(w, r.WithContext(With(r.Context(), p)))
		})
	}
}

// AgentWrites keeps the roles apart: agent keys write, approver keys read and decide. A write (any method but
// GET, HEAD and OPTIONS) by a key that is not an agent key is 403 forbidden, before anything is decoded or
// stored, except on the routes listed in approverWrites (route templates, in ServeMux or gin syntax, compared
// with the path of r.Pattern): the approval endpoints and the resolution of an unknown operation. An approver key is a person's,
// held to approve what agents ask; if it could also send the writes, one stolen approver key would be an agent
// key that can approve others' requests too. It runs after Middleware, on the request its router matched: behind
// a ServeMux, wrap each route's handler (the mux sets r.Pattern before it calls it); in gin, httpserver.Wrap
// sets it to gin's template.
//
//	api := r.Group("", httpserver.Wrap(auth.Middleware(keys)), httpserver.Wrap(auth.AgentWrites(approval.WriteRoutes()...)))
func AgentWrites(approverWrites ...string) func(http.Handler) http.Handler {
	allowed := make(map[string]bool, len(approverWrites))
	for _, r := range approverWrites {
		allowed[template(r)] = true
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			route := r.Pattern
			if _, path, ok := strings.Cut(route, " "); ok {
				route = path
			}
			route = template(route)
			switch {
			case r.Method == http.MethodGet, r.Method == http.MethodHead, r.Method == http.MethodOptions:
			case From(r.Context()).Role != RoleAgent && !allowed[route]:
				problem.Write(w, r, problem.New("forbidden",
					"only an agent key can send writes; an approver key reads and decides approvals: nothing was done"))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// template writes a route template one way, a ServeMux's: gin's :name segment is {name}.
func template(route string) string {
	segments := strings.Split(route, "/")
	for i, s := range segments {
		if name, ok := strings.CutPrefix(s, ":"); ok {
			segments[i] = "{" + name + "}"
		}
	}
	return strings.Join(segments, "/")
}

// Lookup returns the authenticated principal of a request's context, if it has one (the access log asks every
// request).
func Lookup(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// From returns the authenticated principal of a request's context; it panics on a route that is not behind
// Middleware, which is a wiring bug, not a request error.
func From(ctx context.Context) Principal {
	p, ok := Lookup(ctx)
	if !ok {
		panic("auth: no principal in the request context: the route is not behind auth.Middleware")
	}
	return p
}

// ByKeyID returns the principal of the key with id keyID, if API_KEYS still has it: a console session names
// its key by id, so removing a key ends its sessions at their next request.
func (ks *Keys) ByKeyID(keyID string) (Principal, bool) {
	for _, k := range ks.keys {
		if k.principal.KeyID == keyID {
			return k.principal, true
		}
	}
	return Principal{}, false
}

// With returns ctx carrying p as Middleware's does, so From works for routes that authenticate another way
// (the console's session cookie).
func With(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// Without returns a copy of ks without the keys of the principals drop reports true for: a key taken out of
// API_KEYS, as a restart with the smaller list would do.
func (ks *Keys) Without(drop func(Principal) bool) *Keys {
	out := &Keys{}
	for _, k := range ks.keys {
		if !drop(k.principal) {
			out.keys = append(out.keys, k)
		}
	}
	return out
}
