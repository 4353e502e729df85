package idem_test

import (
	"context"
	"net/http"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

type createNote struct {
	Text string `json:"text"`
}

// Validate is the command's own check (httpserver.DecodeCommand calls it): 422 before any key is claimed.
func (c createNote) Validate() error {
	if c.Text == "" {
		return problem.Validation(problem.FieldError{Field: "text", Message: "is required"})
	}
	return nil
}

type note struct {
	ID   string `json:"id"`
	Text string `json:"text"`
}

// Local mode: the claim, the business write and the stored response commit in one transaction. Validation runs
// before Do, so a refused request never burns the key.
func ExampleHandler_Do() {
	var db *gorm.DB // the service's database, migrated with migrations/
	h := &idem.Handler{DB: db, Store: idem.PostgresStore{}}
	r := gin.New()
	r.POST("/v1/notes", func(c *gin.Context) {
		var cmd createNote
		if err := httpserver.DecodeCommand(c, &cmd); err != nil {
			problem.Write(c, err)
			return
		}
		h.Do(c, idem.Request{Kind: "notes.create", Command: cmd},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				n := note{ID: "note_" + op.ID, Text: cmd.Text}
				err := tx.Exec(`INSERT INTO notes (id, account_id, text) VALUES (?, ?, ?)`, n.ID, auth.From(c).AccountID, n.Text).Error
				if err != nil {
					return idem.Result{}, err // rolls the claim back: the key stays free
				}
				return idem.Result{Status: http.StatusCreated, Body: n, Resource: &opstatus.Resource{Type: "note", ID: n.ID}}, nil
			})
	})
}

// External mode: the claim commits with a lease, the effect leaves the process with a downstream key derived from
// the operation, and its answer is recorded after. A lost answer leaves the operation unknown for a Reconciler.
func ExampleDoExternal() {
	var db *gorm.DB
	send := func(ctx context.Context, downstreamKey, text string) (string, error) { return "msg_1", nil } // the other side
	h := &idem.Handler{DB: db, Store: idem.PostgresStore{}}
	r := gin.New()
	r.POST("/v1/messages", func(c *gin.Context) {
		var cmd createNote
		if err := httpserver.DecodeCommand(c, &cmd); err != nil {
			problem.Write(c, err)
			return
		}
		// string is the type of the other side's answer: Call returns it and Record receives it.
		idem.DoExternal(h, c, idem.Request{Kind: "messages.send", Command: cmd}, idem.ExternalSteps[string]{
			Call: func(ctx context.Context, op opstatus.Operation) (string, error) {
				// Return an error wrapping idem.ErrOutcomeUnknown when the answer was lost.
				return send(ctx, "rs-"+op.ID, cmd.Text)
			},
			Record: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, messageID string, callErr error) (idem.Result, error) {
				if callErr != nil {
					return idem.ProblemResult(callErr, opstatus.StateFailed), nil
				}
				return idem.Result{Status: http.StatusCreated, Body: map[string]any{"id": messageID}}, nil
			},
		})
	})
}
