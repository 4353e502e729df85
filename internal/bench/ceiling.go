package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"
)

// The ceiling is the least an idempotent create can do on this stack, measured beside the baseline so that the
// project's figures have a second reference: the baseline's insert, plus a stored key. A request reads its key
// first and a retry is answered from that read alone (no write); a new key is written with its stored response
// and the ticket in one autocommit statement, so a create is two round trips and one commit. What the project
// does beyond that is left out on purpose: no operation and no event history (no status resource to ask after
// a timeout), no audit record of any attempt, no canonical fingerprint (the raw body is hashed), no approvals,
// leases or external effects, no account or rate-limit check. It is a bound to compare with, not a design to
// copy: its fingerprint changes with the body's whitespace, and a retry of a request that was never answered
// cannot tell the caller what happened to it.

// ceilingKey is the ceiling's stored key: the response, written once with the ticket.
type ceilingKey struct {
	AccountID      string `gorm:"primaryKey"`
	IdempotencyKey string `gorm:"primaryKey"`
	Fingerprint    string
	Status         int
	Body           []byte
	CreatedAt      time.Time
}

// ServeCeiling serves POST /v1/tickets (and GET /healthz) at addr on databaseURL until ctx ends, as ServeBaseline
// does, with the least idempotency: see above.
func ServeCeiling(ctx context.Context, databaseURL, addr string) error {
	db, closeDB, err := openReference(databaseURL, &baselineTicket{}, &ceilingKey{})
	if err != nil {
		return err
	}
	defer closeDB()
	r := gin.New()
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.POST("/v1/tickets", func(c *gin.Context) { ceilingCreate(c, db) })
	return serveReference(ctx, addr, r)
}

// keyedRequest is what the ceilings read of a create: its body, the body's hash as its fingerprint, the
// account and the Idempotency-Key.
type keyedRequest struct {
	raw                       []byte
	fingerprint, account, key string
}

// readKeyed reads c's request, or answers 400 and returns false.
func readKeyed(c *gin.Context) (keyedRequest, bool) {
	raw, err := io.ReadAll(io.LimitReader(c.Request.Body, 1<<20))
	if err != nil {
		c.JSON(http.StatusBadRequest, gin.H{"error": err.Error()})
		return keyedRequest{}, false
	}
	key := c.GetHeader("Idempotency-Key")
	if key == "" {
		c.JSON(http.StatusBadRequest, gin.H{"error": "Idempotency-Key is required"})
		return keyedRequest{}, false
	}
	sum := sha256.Sum256(raw)
	return keyedRequest{raw: raw, fingerprint: hex.EncodeToString(sum[:]), account: referenceAccount(c), key: key}, true
}

// create decodes the ticket to create, or answers 400 and returns false.
func (r keyedRequest) create(c *gin.Context) (baselineCreate, bool) {
	var in baselineCreate
	if err := json.Unmarshal(r.raw, &in); err != nil || in.Project == "" || in.Title == "" {
		c.JSON(http.StatusBadRequest, gin.H{"error": "project and title are required"})
		return in, false
	}
	return in, true
}

func ceilingCreate(c *gin.Context, db *gorm.DB) {
	r, ok := readKeyed(c)
	if !ok {
		return
	}
	if ceilingAnswerStored(c, db, r.account, r.key, r.fingerprint) {
		return
	}
	in, ok := r.create(c)
	if !ok {
		return
	}
	t := newBaselineTicket(r.account, in)
	body, err := json.Marshal(t)
	if err != nil {
		c.JSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
		return
	}
	// The key and the ticket in one statement: the ticket is inserted only if the key was. A concurrent copy
	// waits on the key's unique index until the first commits, then inserts nothing and reads the stored answer.
	res := db.WithContext(c).Exec(`WITH k AS (
    INSERT INTO ceiling_keys (account_id, idempotency_key, fingerprint, status, body, created_at) VALUES (?, ?, ?, ?, ?, now())
    ON CONFLICT DO NOTHING RETURNING 1
)
INSERT INTO tickets (id, account_id, project, title, priority, status, created_at) SELECT ?, ?, ?, ?, ?, ?, ? FROM k`,
		r.account, r.key, r.fingerprint, http.StatusCreated, body, t.ID, t.AccountID, t.Project, t.Title, t.Priority, t.Status, t.CreatedAt)
	switch {
	case res.Error != nil:
		c.JSON(http.StatusServiceUnavailable, gin.H{"error": "insert failed"})
	case res.RowsAffected == 1:
		c.Data(http.StatusCreated, "application/json", body)
	case !ceilingAnswerStored(c, db, r.account, r.key, r.fingerprint):
		c.JSON(http.StatusServiceUnavailable, gin.H{"error": "the key was taken and is gone"})
	}
}

// ceilingAnswerStored answers from the stored key, if there is one: its response, or 422 for another body.
func ceilingAnswerStored(c *gin.Context, db *gorm.DB, account, key, fingerprint string) bool {
	var stored []ceilingKey
	if err := db.WithContext(c).Raw(`SELECT fingerprint, status, body FROM ceiling_keys WHERE account_id = ? AND idempotency_key = ?`,
		account, key).Scan(&stored).Error; err != nil || len(stored) == 0 {
		return false
	}
	if stored[0].Fingerprint != fingerprint {
		c.JSON(http.StatusUnprocessableEntity, gin.H{"error": "this Idempotency-Key was used for another request"})
		return true
	}
	c.Data(stored[0].Status, "application/json", stored[0].Body)
	return true
}
