// Command notes is a small notes API on plain net/http and gorm, made retry-safe with pkg/idem: the shape of an
// adopter's service that uses no gin. Its database is opened the usual way, gorm.Open(postgres.Open(dsn),
// &gorm.Config{}), with gorm's default transaction on, and its write is a tx.Create: idem runs it inside the
// transaction that holds the idempotency key's claim, whatever the gorm configuration.
//
//	DATABASE_URL=postgres://... NOTES_TOKEN=secret ADDR=127.0.0.1:8096 go run .
//
// POST /v1/notes {"author": "...", "text": "..."} with an Idempotency-Key creates a note once per key;
// GET /v1/notes?author= lists an author's notes; GET /v1/operations/{id}, .../timeline and
// GET /v1/operations?idempotency_key=K (package opstatus) tell an agent what became of a write; /console
// (package console) shows a person the account's operations. Requests carry NOTES_TOKEN as a bearer API key
// (package auth; NOTES_KEY_ID_SECRET, optional, keys the ids that stand for it), the console's sign-in too. It is its own module (go.mod, with a replace to this
// repository); `make test` builds it and runs `retrysafe conformance` on it, every case including a worker killed
// after its claim (scripts/example-conformance.sh). RETRYSAFE_FAILPOINTS lets that test stop it right after a
// claim; idem.New arms it, nothing here does.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/retrysafe/retrysafe/migrations"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/console"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Note is one note; its id is derived from the operation that created it.
type Note struct {
	ID        string    `json:"id" gorm:"primaryKey"`
	Author    string    `json:"author" gorm:"index"`
	Text      string    `json:"text"`
	CreatedAt time.Time `json:"created_at"`
}

// TableName keeps the example's table apart from the library's.
func (Note) TableName() string { return "example_notes" }

type createNote struct {
	Author string `json:"author"`
	Text   string `json:"text"`
}

func (c createNote) validate() error {
	var fields []problem.FieldError
	fields = problem.CheckText(fields, "author", c.Author, 100, true)
	fields = problem.CheckText(fields, "text", c.Text, 1000, true)
	if len(fields) > 0 {
		return problem.Validation(fields...)
	}
	return nil
}

// newServer serves the notes API with h behind keys (auth.Middleware), and the console, where a person signs
// in with a key of keys.
func newServer(db *gorm.DB, h *idem.Handler, keys *auth.Keys) (http.Handler, error) {
	mux := http.NewServeMux()
	api := auth.Middleware(keys)
	mux.Handle("POST /v1/notes", api(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var cmd createNote
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cmd); err != nil {
			problem.Write(w, r, problem.New("invalid_request", "the body must be {\"author\": \"...\", \"text\": \"...\"}"))
			return
		}
		if err := cmd.validate(); err != nil {
			problem.Write(w, r, err) // before the claim: a refused request never burns its key
			return
		}
		h.Handle(w, r, idem.Request{Kind: "notes.create", Command: cmd},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				n := Note{ID: "note_" + strings.TrimPrefix(op.ID, "op_"), Author: cmd.Author, Text: cmd.Text}
				if err := tx.WithContext(ctx).Create(&n).Error; err != nil {
					return idem.Result{}, err // rolls the claim back: the key stays free
				}
				return idem.Result{Status: http.StatusCreated, Body: n, Resource: &opstatus.Resource{Type: "note", ID: n.ID}}, nil
			})
	})))
	mux.Handle("GET /v1/notes", api(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var notes []Note
		if err := db.WithContext(r.Context()).Where("author = ?", r.URL.Query().Get("author")).Order("created_at").Limit(1000).Find(&notes).Error; err != nil {
			problem.Write(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": notes})
	})))
	// The operations routes, so an agent can look an operation up before it retries (docs/agents.md).
	pool, err := db.DB() // the pool under gorm's handle, as the library's reads take it
	if err != nil {
		return nil, err
	}
	for pattern, h := range opstatus.Routes(pool) {
		mux.Handle(pattern, api(h))
	}
	// The console: the account's operations and their timelines, for a person who signs in with the key.
	pages, err := console.Routes(console.Options{DB: pool, Keys: keys, Service: "notes"})
	if err != nil {
		return nil, err
	}
	for pattern, h := range pages {
		mux.Handle(pattern, h)
	}
	return mux, nil
}

// notesKeys are the API keys of notes: one agent key of the account acct_notes, whose secret is token. Key
// ids (what operations and the console show instead of the secret) are keyed by idSecret; when it is empty, by
// one drawn at start, so they change when notes restarts and a restart ends the console's sessions.
func notesKeys(token, idSecret string) (*auth.Keys, error) {
	if idSecret == "" {
		b := make([]byte, 32)
		_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
		idSecret = hex.EncodeToString(b)
	}
	return auth.ParseKeys("acct_notes:agent:"+token, idSecret)
}

func main() {
	if err := run(); err != nil {
		slog.Error("notes stopped", "error", err.Error())
		os.Exit(1)
	}
}

func run() error {
	dsn, token, addr := os.Getenv("DATABASE_URL"), os.Getenv("NOTES_TOKEN"), os.Getenv("ADDR")
	if dsn == "" || token == "" {
		return errors.New("set DATABASE_URL and NOTES_TOKEN")
	}
	if addr == "" {
		addr = "127.0.0.1:8096"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: gormlogger.Discard})
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	sqlDB.SetMaxOpenConns(10)
	if err := migrations.Up(ctx, sqlDB); err != nil {
		return err
	}
	if err := db.AutoMigrate(&Note{}); err != nil {
		return err
	}
	h, err := idem.New(db) // refuses a pool it cannot use (another driver, a transaction)
	if err != nil {
		return err
	}
	// Pruning (responses kept 72 h, keys 90 days), lease recovery and audit sealing, with their defaults.
	go h.RunBackground(ctx, idem.Background{})
	keys, err := notesKeys(token, os.Getenv("NOTES_KEY_ID_SECRET"))
	if err != nil {
		return err
	}
	handler, err := newServer(db, h, keys)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: addr, Handler: handler, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	slog.Info("notes listening", "addr", addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
