package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

const (
	// sessionCookie holds the opaque session id; signinCookie the CSRF token of the sign-in form, which has
	// no session yet (double submit).
	sessionCookie = "retrysafe_console"
	signinCookie  = "retrysafe_console_signin"
	csrfField     = "csrf_token"
)

// sessionKey is the request context key of the Session.
type sessionKey struct{}

// Session is the signed-in person as the pages see it: never the key, only its id and role.
type Session struct {
	AccountID string
	Role      auth.Role
	KeyID     string
	CSRF      string
}

// CanDecide reports whether the session's key may decide approvals.
func (s Session) CanDecide() bool { return s.Role == auth.RoleApprover }

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

// hashID is what console_sessions stores of a session id.
func hashID(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// setCookie sets a cookie of the console: HttpOnly, SameSite=Strict, and Secure under TLS or when
// Options.SecureCookie says a TLS proxy is in front (the request the server sees is then plain HTTP).
func (c *console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, Secure: c.o.SecureCookie || r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// cookie is the value of the request's cookie name, query-unescaped ("" and an error when it has none).
func cookie(r *http.Request, name string) (string, error) {
	k, err := r.Cookie(name)
	if err != nil {
		return "", err
	}
	v, _ := url.QueryUnescape(k.Value)
	return v, nil
}

// signinTTL is how long a sign-in form stays usable.
const signinTTL = time.Hour

// signinToken is the CSRF token of a sign-in form, issued at now: a random nonce and the time, signed with the
// console's secret. The form carries it and the browser keeps it in a cookie (double submit); as the server
// signed it, a pair an attacker makes up is refused, and a pair the server issued runs out after signinTTL.
func (c *console) signinToken(now time.Time) string {
	payload := make([]byte, 24)
	_, _ = rand.Read(payload[:16]) // crypto/rand.Read never fails (Go 1.24+)
	binary.BigEndian.PutUint64(payload[16:], uint64(now.Unix()))
	return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(c.sign(payload))
}

func (c *console) sign(payload []byte) []byte {
	mac := hmac.New(sha256.New, c.o.Secret)
	mac.Write([]byte("retrysafe console sign-in\x00"))
	mac.Write(payload)
	return mac.Sum(nil)
}

// validSigninToken reports whether token is one signinToken issued within signinTTL before now.
func (c *console) validSigninToken(token string, now time.Time) bool {
	p, sig, ok := strings.Cut(token, ".")
	payload, err1 := base64.RawURLEncoding.DecodeString(p)
	mac, err2 := base64.RawURLEncoding.DecodeString(sig)
	if !ok || err1 != nil || err2 != nil || len(payload) != 24 || !hmac.Equal(mac, c.sign(payload)) {
		return false
	}
	issued := time.Unix(int64(binary.BigEndian.Uint64(payload[16:])), 0)
	return !issued.After(now.Add(time.Minute)) && now.Sub(issued) < signinTTL
}

func (c *console) signinForm(w http.ResponseWriter, r *http.Request, status int, failed bool) {
	token := c.signinToken(time.Now())
	c.setCookie(w, r, signinCookie, token, int(signinTTL.Seconds()))
	c.render(w, r, status, "signin", map[string]any{"Title": "Sign in", "CSRF": token, "Failed": failed})
}

func (c *console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.signinForm(w, r, http.StatusOK, false)
}

// signin opens a session for the key typed in the form. The key travels only in the POST body and is never
// stored: the session names the key by its id. The form must come from this console: a same-origin POST
// (checkOrigin) whose token matches its cookie and was signed here.
func (c *console) signin(w http.ResponseWriter, r *http.Request) {
	token, err := cookie(r, signinCookie)
	form := r.PostFormValue(csrfField)
	if err != nil || subtle.ConstantTimeCompare([]byte(token), []byte(form)) != 1 || !c.validSigninToken(form, time.Now()) {
		c.fail(w, r, problem.New("forbidden", "the sign-in form expired or did not come from this console; reload it"))
		return
	}
	p, ok := c.o.Keys.Authenticate(r.PostFormValue("key"))
	if !ok {
		c.signinForm(w, r, http.StatusUnauthorized, true)
		return
	}
	id := randomToken()
	ctx := r.Context()
	err = database.InTx(ctx, c.o.DB, nil, func(tx *sql.Tx) error {
		// Sweep sessions idle too long while here: they could no longer be used, only read.
		if _, err := tx.ExecContext(ctx, `DELETE FROM console_sessions WHERE last_seen_at < $1`, time.Now().Add(-c.o.IdleTimeout)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO console_sessions (id_hash, account_id, role, key_id, csrf_token) VALUES ($1, $2, $3, $4, $5)`,
			hashID(id), p.AccountID, string(p.Role), p.KeyID, randomToken()); err != nil {
			return err
		}
		// A key holds at most MaxSessionsPerKey sessions: this one and the most recently used of the others.
		_, err := tx.ExecContext(ctx, evictSessions, p.KeyID, hashID(id), c.o.MaxSessionsPerKey-1)
		return err
	})
	if err != nil {
		c.fail(w, r, fmt.Errorf("console: open session: %w", err))
		return
	}
	c.setCookie(w, r, signinCookie, "", -1)
	c.setCookie(w, r, sessionCookie, id, 0)
	http.Redirect(w, r, Prefix+"/approvals", http.StatusSeeOther)
}

// evictSessions ends the sessions of a key ($1) but the new one ($2) and the N ($3) it used last. The person
// signing in is there now; a session left open elsewhere is the one to end.
const evictSessions = `DELETE FROM console_sessions WHERE key_id = $1 AND id_hash <> $2 AND id_hash NOT IN (
    SELECT id_hash FROM console_sessions WHERE key_id = $1 AND id_hash <> $2 ORDER BY last_seen_at DESC, id_hash LIMIT $3)`

// session loads the session of the cookie, touching it in the same statement, or sends the browser to sign in.
func (c *console) session(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, s, err := c.signedIn(r)
		switch {
		case err != nil:
			c.fail(w, r, err)
		case s == nil && r.Method != http.MethodGet:
			// Refused before the form is read, as the API refuses a request without a key.
			problem.CloseUnread(w, r)
			c.fail(w, r, problem.New("unauthorized", "sign in first"))
		case s == nil:
			http.Redirect(w, r, Prefix+"/signin", http.StatusSeeOther)
		default:
			ctx := context.WithValue(auth.With(r.Context(), p), sessionKey{}, *s)
			next.ServeHTTP(w, r.WithContext(ctx))
		}
	})
}

// signedIn is the principal and the session of the request's cookie, touching the session in the same
// statement; nil when the cookie names no live session of a key API_KEYS still has.
func (c *console) signedIn(r *http.Request) (auth.Principal, *Session, error) {
	id, err := cookie(r, sessionCookie)
	if err != nil || id == "" {
		return auth.Principal{}, nil, nil
	}
	var accountID, role, keyID, csrf string
	err = c.o.DB.QueryRowContext(r.Context(), `UPDATE console_sessions SET last_seen_at = now()
WHERE id_hash = $1 AND last_seen_at >= $2 RETURNING account_id, role, key_id, csrf_token`,
		hashID(id), time.Now().Add(-c.o.IdleTimeout)).Scan(&accountID, &role, &keyID, &csrf)
	if errors.Is(err, sql.ErrNoRows) {
		return auth.Principal{}, nil, nil
	} else if err != nil {
		return auth.Principal{}, nil, fmt.Errorf("console: session: %w", err)
	}
	// The key must still be in API_KEYS: removing a key ends its sessions.
	p, ok := c.o.Keys.ByKeyID(keyID)
	if !ok || p.AccountID != accountID || string(p.Role) != role {
		return auth.Principal{}, nil, nil
	}
	return p, &Session{AccountID: p.AccountID, Role: p.Role, KeyID: p.KeyID, CSRF: csrf}, nil
}

func sessionOf(r *http.Request) Session { return r.Context().Value(sessionKey{}).(Session) }

// checkOrigin refuses a POST a browser says came from another origin (Sec-Fetch-Site, or Origin against Host:
// net/http's CrossOriginProtection). It runs before every POST of the console, the sign-in included, which has
// no session yet to bind a token to.
func (c *console) checkOrigin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := c.origins.Check(r); err != nil {
			c.fail(w, r, problem.New("forbidden", "this form was sent from another site; open the console and send it from there"))
			return
		}
		next(w, r)
	}
}

// checkCSRF refuses a POST whose form does not carry the session's token: SameSite=Strict already keeps the
// cookie off other sites' requests, the token keeps it so on browsers that ignore SameSite.
func (c *console) checkCSRF(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		want := sessionOf(r).CSRF
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue(csrfField)), []byte(want)) != 1 {
			c.fail(w, r, problem.New("forbidden", "this form did not come from your console session (CSRF token missing or wrong); reload the page"))
			return
		}
		next(w, r)
	}
}

func (c *console) signout(w http.ResponseWriter, r *http.Request) {
	id, _ := cookie(r, sessionCookie)
	if _, err := c.o.DB.ExecContext(r.Context(), `DELETE FROM console_sessions WHERE id_hash = $1`, hashID(id)); err != nil {
		c.fail(w, r, fmt.Errorf("console: sign out: %w", err))
		return
	}
	c.setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, Prefix+"/signin", http.StatusSeeOther)
}
