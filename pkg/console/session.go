package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

const (
	// sessionCookie holds the opaque session id; signinCookie the CSRF token of the sign-in form, which has
	// no session yet (double submit).
	sessionCookie = "retrysafe_console"
	signinCookie  = "retrysafe_console_signin"
	csrfField     = "csrf_token"
	sessionKey    = "retrysafe.console.session"
)

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

func setCookie(ctx *gin.Context, name, value string, maxAge int) {
	http.SetCookie(ctx.Writer, &http.Cookie{
		Name: name, Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, Secure: ctx.Request.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

func (c *console) signinPage(ctx *gin.Context) {
	token := randomToken()
	setCookie(ctx, signinCookie, token, 3600)
	c.render(ctx, http.StatusOK, "signin", map[string]any{"Title": "Sign in", "CSRF": token})
}

// signin opens a session for the key typed in the form. The key travels only in the POST body and is never
// stored: the session names the key by its id.
func (c *console) signin(ctx *gin.Context) {
	cookie, err := ctx.Cookie(signinCookie)
	form := ctx.PostForm(csrfField)
	if err != nil || cookie == "" || subtle.ConstantTimeCompare([]byte(cookie), []byte(form)) != 1 {
		c.fail(ctx, problem.New(problem.CodeForbidden, "the sign-in form expired or did not come from this console; reload it"))
		return
	}
	p, ok := c.o.Keys.Authenticate(ctx.PostForm("key"))
	if !ok {
		token := randomToken()
		setCookie(ctx, signinCookie, token, 3600)
		c.render(ctx, http.StatusUnauthorized, "signin", map[string]any{"Title": "Sign in", "CSRF": token, "Failed": true})
		return
	}
	id := randomToken()
	db := c.o.DB.WithContext(ctx)
	// Sweep sessions idle too long while here: they could no longer be used, only read.
	err = db.Exec(`DELETE FROM console_sessions WHERE last_seen_at < ?`, time.Now().Add(-c.o.IdleTimeout)).Error
	if err == nil {
		err = db.Exec(`INSERT INTO console_sessions (id_hash, account_id, role, key_id, csrf_token) VALUES (?, ?, ?, ?, ?)`,
			hashID(id), p.AccountID, string(p.Role), p.KeyID, randomToken()).Error
	}
	if err != nil {
		c.fail(ctx, fmt.Errorf("console: open session: %w", err))
		return
	}
	setCookie(ctx, signinCookie, "", -1)
	setCookie(ctx, sessionCookie, id, 0)
	ctx.Redirect(http.StatusSeeOther, Prefix+"/approvals")
}

// session loads the session of the cookie, touching it in the same statement, or sends the browser to sign in.
func (c *console) session(ctx *gin.Context) {
	id, err := ctx.Cookie(sessionCookie)
	var rows []struct {
		AccountID string
		Role      string
		KeyID     string
		CSRFToken string `gorm:"column:csrf_token"`
	}
	if err == nil && id != "" {
		err = c.o.DB.WithContext(ctx).Raw(`UPDATE console_sessions SET last_seen_at = now()
WHERE id_hash = ? AND last_seen_at >= ? RETURNING account_id, role, key_id, csrf_token`,
			hashID(id), time.Now().Add(-c.o.IdleTimeout)).Scan(&rows).Error
		if err != nil {
			c.fail(ctx, fmt.Errorf("console: session: %w", err))
			return
		}
	}
	var p auth.Principal
	ok := len(rows) == 1
	if ok {
		// The key must still be in API_KEYS: removing a key ends its sessions.
		p, ok = c.o.Keys.ByKeyID(rows[0].KeyID)
		ok = ok && p.AccountID == rows[0].AccountID && string(p.Role) == rows[0].Role
	}
	if !ok {
		if ctx.Request.Method != http.MethodGet {
			c.fail(ctx, problem.New(problem.CodeUnauthorized, "sign in first"))
			return
		}
		ctx.Redirect(http.StatusSeeOther, Prefix+"/signin")
		ctx.Abort()
		return
	}
	auth.With(ctx, p)
	ctx.Set(sessionKey, Session{AccountID: p.AccountID, Role: p.Role, KeyID: p.KeyID, CSRF: rows[0].CSRFToken})
	ctx.Next()
}

func sessionOf(ctx *gin.Context) Session { return ctx.MustGet(sessionKey).(Session) }

// checkCSRF refuses a POST whose form does not carry the session's token: SameSite=Strict already keeps the
// cookie off other sites' requests, the token keeps it so on browsers that ignore SameSite.
func (c *console) checkCSRF(ctx *gin.Context) {
	want := sessionOf(ctx).CSRF
	if subtle.ConstantTimeCompare([]byte(ctx.PostForm(csrfField)), []byte(want)) != 1 {
		c.fail(ctx, problem.New(problem.CodeForbidden, "this form did not come from your console session (CSRF token missing or wrong); reload the page"))
		return
	}
	ctx.Next()
}

func (c *console) signout(ctx *gin.Context) {
	id, _ := ctx.Cookie(sessionCookie)
	if err := c.o.DB.WithContext(ctx).Exec(`DELETE FROM console_sessions WHERE id_hash = ?`, hashID(id)).Error; err != nil {
		c.fail(ctx, fmt.Errorf("console: sign out: %w", err))
		return
	}
	setCookie(ctx, sessionCookie, "", -1)
	ctx.Redirect(http.StatusSeeOther, Prefix+"/signin")
}
