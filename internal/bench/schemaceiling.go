package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/schema"
)

// The schema ceiling is the ceiling (ceiling.go) writing the rows retrysafe's design asks for, into retrysafe's
// own schema (migrations/ and services/schema, with their indexes, constraints and triggers): a create is the
// operation holding its key with the stored response, the operation's one event (its attempt record) and the
// ticket, in one autocommit statement after the key's read; a retry is the key's read and one attempt record,
// a plain insert. Still two round trips and one commit each, as the ceiling's create.
//
// It measures how much of retrysafe's distance from the ceiling is the rows themselves (three rows and nine
// index entries where the ceiling writes two and two) and how much is the project's own work around them:
// the claim's transaction and lock, the canonical fingerprint, the adopter's handler in that transaction, the
// sealing of the records, accounts, rate limits, logs and metrics, which this server does none of. It is not a
// design to copy either: its fingerprint is the raw body's, a copy of a request still running waits on the key's
// index until the first commits instead of being answered from the operation's state, and nothing seals its
// records.

// ServeSchemaCeiling serves POST /v1/tickets (and GET /healthz) at addr on databaseURL until ctx ends, as
// ServeCeiling does, on retrysafe's schema (applied first).
func ServeSchemaCeiling(ctx context.Context, databaseURL, addr string) error {
	db, closeDB, err := openReference(databaseURL)
	if err != nil {
		return err
	}
	defer closeDB()
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	if err := schema.Up(ctx, sqlDB); err != nil {
		return err
	}
	r := gin.New()
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.POST("/v1/tickets", func(c *gin.Context) { schemaCeilingCreate(c, db) })
	return serveReference(ctx, addr, r)
}

// schemaTicket is the answer services/tickets gives a create (tickets.CreateResult), written out here: importing
// the service would grow this binary, whose baseline server is the yardstick of the memory goal, by 3 MB.
type schemaTicket struct {
	ID            string    `json:"id"`
	Project       string    `json:"project"`
	Title         string    `json:"title"`
	Description   string    `json:"description"`
	Priority      string    `json:"priority"`
	Status        string    `json:"status"`
	SourceEventID *string   `json:"source_event_id"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
	Deduplicated  bool      `json:"deduplicated"`
}

func schemaCeilingCreate(c *gin.Context, db *gorm.DB) {
	start := time.Now()
	r, ok := readKeyed(c)
	if !ok {
		return
	}
	if schemaCeilingAnswerStored(c, db, r.account, r.key, r.fingerprint) {
		return
	}
	in, ok := r.create(c)
	if !ok {
		return
	}
	if in.Priority == "" {
		in.Priority = "normal"
	}
	now := time.Now().UTC()
	t := schemaTicket{ID: ids.New("tkt_"), Project: in.Project, Title: in.Title, Priority: in.Priority, Status: "open",
		CreatedAt: now, UpdatedAt: now}
	body, err := json.Marshal(t)
	if err != nil {
		c.JSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
		return
	}
	header, _ := json.Marshal(map[string][]string{"Location": {"/v1/tickets/" + t.ID}})
	detail, _ := json.Marshal(map[string]any{"attempt_id": ids.New("att_"), "duration_ms": time.Since(start).Milliseconds(),
		"fingerprint": r.fingerprint, "outcome": "created", "status": http.StatusCreated})
	// The operation (holding the key, its response stored), its event and the ticket in one statement
	// (opstore.CeilingCreate).
	created, err := opstore.CeilingCreate(c, database.SQL(db), r.account, ids.New("op_"), r.key, r.fingerprint, string(header), body, string(detail),
		opstore.CeilingTicket{ID: t.ID, Project: t.Project, Title: t.Title, Priority: t.Priority, CreatedAt: now, UpdatedAt: now})
	switch {
	case err != nil:
		c.JSON(http.StatusServiceUnavailable, gin.H{"error": "insert failed"})
	case created:
		c.Header("Location", "/v1/tickets/"+t.ID)
		c.Data(http.StatusCreated, "application/json", body)
	case !schemaCeilingAnswerStored(c, db, r.account, r.key, r.fingerprint):
		c.JSON(http.StatusServiceUnavailable, gin.H{"error": "the key was taken and is gone"})
	}
}

// schemaCeilingAnswerStored answers from the operation holding the key, if there is one, after recording the
// attempt: its stored response, or 422 for another body.
func schemaCeilingAnswerStored(c *gin.Context, db *gorm.DB, account, key, fingerprint string) bool {
	op, found, err := opstore.CeilingLookup(c, database.SQL(db), account, key)
	if err != nil || !found {
		return false
	}
	event, status, outcome := "replayed", op.ResponseStatus, "replayed"
	if op.Fingerprint != fingerprint {
		event, status, outcome = "conflict_rejected", http.StatusUnprocessableEntity, "refused"
	}
	detail, _ := json.Marshal(map[string]any{"attempt_id": ids.New("att_"), "fingerprint": fingerprint,
		"outcome": outcome, "status": status})
	if err := opstore.CeilingAttempt(c, database.SQL(db), op.ID, account, event, string(detail)); err != nil {
		c.JSON(http.StatusServiceUnavailable, gin.H{"error": fmt.Sprintf("record the attempt: %v", err)})
		return true
	}
	if status == http.StatusUnprocessableEntity {
		c.JSON(status, gin.H{"error": "this Idempotency-Key was used for another request"})
		return true
	}
	c.Data(status, "application/json", op.ResponseBody)
	return true
}
