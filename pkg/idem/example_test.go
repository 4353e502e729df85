package idem_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

type createNote struct {
	Text string `json:"text"`
}

// Validate is the command's own check (httpjson.DecodeCommand calls it): 422 before any key is claimed.
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

// A net/http service: the caller is put in the request's context by the service's authentication, and the
// write runs in the transaction that holds the claim. Validation runs before Handle, so a refused request never
// burns the key.
func ExampleHandler_Handle() {
	var db *gorm.DB // gorm.Open(postgres.Open(dsn), &gorm.Config{}), migrated with migrations.Up
	h, err := idem.New(db)
	if err != nil {
		log.Fatal(err) // another driver, or a transaction instead of the pool
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/notes", func(w http.ResponseWriter, r *http.Request) {
		var cmd createNote
		if err := json.NewDecoder(r.Body).Decode(&cmd); err != nil || cmd.Validate() != nil {
			problem.Write(w, r, problem.New("invalid_request", "send {\"text\": \"...\"}"))
			return
		}
		h.Handle(w, r, idem.Request{Kind: "notes.create", Command: cmd},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				n := note{ID: "note_" + op.ID, Text: cmd.Text}
				if err := tx.Create(&n).Error; err != nil {
					return idem.Result{}, err // rolls the claim back: the key stays free
				}
				return idem.Result{Status: http.StatusCreated, Body: n, Resource: &opstatus.Resource{Type: "note", ID: n.ID}}, nil
			})
	})
	authenticated := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The service's own authentication names the caller.
		ctx := idem.WithCaller(r.Context(), idem.Caller{AccountID: "acct_1", Actor: "agent:key_1"})
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
	_ = http.ListenAndServe("127.0.0.1:8080", authenticated)
}

// The same write in gin (package idemgin), behind auth.Middleware.
func Example_gin() {
	var db *gorm.DB
	h, err := idem.New(db)
	if err != nil {
		log.Fatal(err) // another driver, or a transaction instead of the pool
	}
	r := gin.New()
	r.POST("/v1/notes", func(c *gin.Context) {
		var cmd createNote
		if err := httpjson.DecodeCommand(c.Request, &cmd); err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		idemgin.Do(h, c, idem.Request{Kind: "notes.create", Command: cmd},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				n := note{ID: "note_" + op.ID, Text: cmd.Text}
				if err := tx.Create(&n).Error; err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: http.StatusCreated, Body: n, Resource: &opstatus.Resource{Type: "note", ID: n.ID}}, nil
			})
	})
}

// External mode: the claim commits with a lease, the effect leaves the process with a downstream key derived from
// the account and the Idempotency-Key, and its answer is recorded after. A lost answer leaves the operation unknown for a Reconciler.
func ExampleRunExternal() {
	var db *gorm.DB
	send := func(ctx context.Context, downstreamKey, text string) (string, error) { return "msg_1", nil } // the other side
	h, err := idem.New(db)
	if err != nil {
		log.Fatal(err) // another driver, or a transaction instead of the pool
	}
	r := gin.New()
	r.POST("/v1/messages", func(c *gin.Context) {
		var cmd createNote
		if err := httpjson.DecodeCommand(c.Request, &cmd); err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		// string is the type of the other side's answer: Call returns it and Record receives it.
		idemgin.DoExternal(h, c, idem.Request{Kind: "messages.send", Command: cmd}, idem.ExternalSteps[string]{
			Call: func(ctx context.Context, op opstatus.Operation) (string, error) {
				// Return an error wrapping idem.ErrOutcomeUnknown when the answer was lost.
				return send(ctx, "rs-"+op.AccountID+"-"+op.IdempotencyKey, cmd.Text)
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
