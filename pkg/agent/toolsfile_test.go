package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// notesTools is a tools file for a service that is none of the demo services: notes in books.
const notesTools = `
services:
  notes:
    base_url_env: NOTES_URL
    operations: /v1/operations
tools:
  - name: add_note
    summary: Add a note to a book.
    service: notes
    method: POST
    path: /v1/books/{book}/notes
    retry_mode: create
    input_schema:
      type: object
      additionalProperties: false
      required: [book, text]
      properties:
        book: {type: string, pattern: '^[a-z0-9-]+$'}
        text: {type: string, minLength: 1, maxLength: 200}
        pinned: {type: boolean}
`

// notesBundle is a small notes service on pkg/idem and a real PostgreSQL schema, with the operations routes
// mounted, and the fault transport in front of it.
type notesBundle struct {
	env     *servicetest.Env
	fault   *fault
	catalog *agent.Catalog
	journal string
}

func notesService(t *testing.T) *notesBundle {
	t.Helper()
	env := servicetest.New(t)
	if err := env.DB.Exec(`CREATE TABLE IF NOT EXISTS book_notes (id text PRIMARY KEY, book text NOT NULL, body text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	add := func(c *gin.Context) {
		var in struct {
			Text   string `json:"text"`
			Pinned bool   `json:"pinned"`
		}
		if err := c.ShouldBindJSON(&in); err != nil {
			c.JSON(http.StatusBadRequest, gin.H{"code": "invalid_request"})
			return
		}
		book := c.Param("book")
		idemgin.Do(env.Idem, c, idem.Request{Kind: "notes.add", Command: map[string]any{"book": book, "text": in.Text, "pinned": in.Pinned}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				id := "note_" + strings.TrimPrefix(op.ID, "op_")
				if err := tx.Exec(`INSERT INTO book_notes (id, book, body) VALUES (?, ?, ?)`, id, book, in.Text).Error; err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: http.StatusCreated, Body: map[string]any{"id": id, "book": book, "text": in.Text}}, nil
			})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) {
		api.POST("/v1/books/:book/notes", add)
	}))
	path := filepath.Join(t.TempDir(), "notes-tools.yaml")
	if err := os.WriteFile(path, []byte(notesTools), 0o600); err != nil {
		t.Fatal(err)
	}
	catalog, err := agent.LoadTools(path)
	if err != nil {
		t.Fatal(err)
	}
	return &notesBundle{env: env, fault: &fault{next: http.DefaultTransport}, catalog: catalog,
		journal: filepath.Join(t.TempDir(), "notes.journal")}
}

func (b *notesBundle) open(t *testing.T) *agent.Agent {
	t.Helper()
	urls := b.catalog.BaseURLs(func(name string) string {
		if name == "NOTES_URL" {
			return b.env.URL
		}
		return ""
	})
	a, err := agent.Open(b.journal, agent.Config{Tools: b.catalog, BaseURLs: urls, APIKey: servicetest.AgentSecret,
		HTTPClient: &http.Client{Transport: b.fault}, BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func (b *notesBundle) notes(t *testing.T, body string) int {
	t.Helper()
	var n int
	if err := b.env.DB.Raw(`SELECT count(*) FROM book_notes WHERE body = ?`, body).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// A tool from a file, for a service that is not a demo service, keeps the promise: its first answer lost, the
// agent looks the operation up on the route the file names and sends again with the same key; the same action
// id called again sends nothing. One note.
func TestToolFromAFile(t *testing.T) {
	t.Parallel()
	b := notesService(t)
	a := b.open(t)
	if names := a.Tools().Names(); !slices.Equal(names, []string{"add_note"}) {
		t.Fatalf("tools %v; want the file's one tool", names)
	}
	b.fault.loseAnswers.Store(1)
	args := json.RawMessage(`{"book":"ops-log","text":"rotated the key"}`)
	res, err := a.Do(t.Context(), "note-1", "add_note", args, agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded || res.HTTPStatus != http.StatusCreated || res.Attempts != 2 {
		t.Fatalf("Do = %+v, %v; want succeeded after the lost answer and one retry", res, err)
	}
	op, _ := a.Operation("note-1")
	if op.Path != "/v1/books/ops-log/notes" || op.Service != "notes" ||
		!slices.ContainsFunc(op.Observations, func(o *agent.Observation) bool {
			return o.Kind == agent.ObsLookup && o.Found != nil && *o.Found && strings.HasPrefix(o.Endpoint, "GET /v1/operations?idempotency_key=")
		}) {
		t.Errorf("operation %s %s, observations %v; want the path filled in and a found lookup on the file's route", op.Service, op.Path, op.Observations)
	}
	again, err := a.Do(t.Context(), "note-1", "add_note", json.RawMessage(`{"text":"rotated the key", "book":"ops-log"}`), agent.DoOptions{})
	if err != nil || again.OperationID != res.OperationID || again.Attempts != 2 {
		t.Errorf("Do again = %+v, %v; want the same operation, nothing sent", again, err)
	}
	if n := b.notes(t, "rotated the key"); n != 1 || b.fault.writes.Load() != 2 {
		t.Errorf("%d notes, %d sends; want 1 note from 2 sends", n, b.fault.writes.Load())
	}
}

// Arguments are checked against the tool's input schema before anything is journaled or sent: the refusal
// names each argument, the action id stays free, and the same action id with good arguments then makes the note.
func TestBadArgumentsBurnNoActionID(t *testing.T) {
	t.Parallel()
	b := notesService(t)
	a := b.open(t)
	for _, tc := range []struct {
		args string
		want []string
	}{
		{`{"book":"ops-log","text":""}`, []string{"text"}},
		{`{"book":"Ops Log","text":"x","pinned":"yes"}`, []string{"book", "pinned"}},
		{`{"book":"ops-log"}`, []string{""}}, // the object: a missing argument, named in the message
		{`{"book":"ops-log","text":"x","colour":"red"}`, []string{""}},
		{`["ops-log"]`, []string{""}},
	} {
		_, err := a.Do(t.Context(), "note-2", "add_note", json.RawMessage(tc.args), agent.DoOptions{})
		var ae *agent.ArgumentError
		if !errors.As(err, &ae) || !errors.Is(err, agent.ErrBadArguments) {
			t.Fatalf("%s: %v; want an ArgumentError", tc.args, err)
		}
		var got []string
		for _, p := range ae.Problems {
			got = append(got, p.Argument)
		}
		if !slices.Equal(got, tc.want) || !strings.Contains(err.Error(), "action id is still free") {
			t.Errorf("%s: arguments %v in %q; want %v", tc.args, got, err, tc.want)
		}
		if tc.args == `{"book":"ops-log"}` && !strings.Contains(err.Error(), "missing argument 'text'") {
			t.Errorf("a missing argument: %q does not name it", err)
		}
		if tc.args == `{"book":"ops-log","text":"x","colour":"red"}` && !strings.Contains(err.Error(), "colour") {
			t.Errorf("an unknown argument: %q does not name it", err)
		}
	}
	if _, ok := a.Operation("note-2"); ok || b.fault.writes.Load() != 0 {
		t.Fatalf("after refused arguments: operation in the journal %v, %d sends; want none", ok, b.fault.writes.Load())
	}
	res, err := a.Do(t.Context(), "note-2", "add_note", json.RawMessage(`{"book":"ops-log","text":"good now"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateSucceeded || b.notes(t, "good now") != 1 {
		t.Fatalf("the same action id with good arguments: %+v, %v", res, err)
	}
	if rep, err := agent.VerifyJournal(b.journal); err != nil || !rep.Intact() {
		t.Errorf("journal: %v %+v", err, rep)
	}
}

// The demo tools are a tools file too, embedded: every tool loads, and its schema refuses what the service would.
func TestDemoTools(t *testing.T) {
	t.Parallel()
	c := agent.DemoTools()
	want := []string{"add_comment", "cancel_deploy", "cancel_payment", "capture_payment", "create_payment_intent", "create_ticket",
		"refund_payment", "request_approval", "request_deploy", "rollback_deploy", "set_ticket_status"}
	if !slices.Equal(c.Names(), want) {
		t.Fatalf("demo tools %v; want %v", c.Names(), want)
	}
	capture, _ := c.Tool("capture_payment")
	if !capture.Approval || !capture.Keyed || capture.Mode != agent.Financial || capture.Route != "/v1/payment_intents/{intent_id}/capture" {
		t.Errorf("capture_payment: %+v", capture)
	}
	props := capture.Schema()["properties"].(map[string]any)
	if _, ok := props["approval_id"]; !ok {
		t.Errorf("capture_payment's schema has no approval_id: %v", props)
	}
	if status, _ := c.Tool("set_ticket_status"); status.Keyed {
		t.Error("set_ticket_status (converge) sends a key")
	}
	urls := c.BaseURLs(func(name string) string { return map[string]string{"PAYMENTS_URL": "http://payments.test/"}[name] })
	if urls["tickets"] != "http://127.0.0.1:8081" || urls["payments"] != "http://payments.test" {
		t.Errorf("base URLs %v", urls)
	}
	b := setup(t)
	a := b.open(t)
	_, err := a.Do(t.Context(), "prio", "create_ticket", json.RawMessage(`{"project":"ops","title":"t","priority":"asap"}`), agent.DoOptions{})
	if !errors.Is(err, agent.ErrBadArguments) || !strings.Contains(err.Error(), `argument "priority"`) || b.fault.writes.Load() != 0 {
		t.Errorf("a priority outside the enum: %v (%d sends); want refused naming priority, nothing sent", err, b.fault.writes.Load())
	}
}

// A tools file that would let the agent double an effect, or could not describe its arguments, is refused
// when it is read, naming the tool and the fault.
func TestToolsFileRefusals(t *testing.T) {
	t.Parallel()
	service := "services:\n  s: {base_url: 'http://127.0.0.1:1', operations: /v1/operations}\n  bare: {base_url: 'http://127.0.0.1:2'}\ntools:\n"
	// tool is a file of one tool, its fields the minimal tool's with fields ("key: value; ...") in their place.
	tool := func(fields string) string {
		keys := []string{"name", "summary", "service", "method", "path", "retry_mode", "input_schema"}
		values := map[string]string{"name": "t", "summary": "S.", "service": "s", "method": "POST", "path": "/v1/x",
			"retry_mode": "create", "input_schema": "{type: object}"}
		for f := range strings.SplitSeq(fields, "; ") {
			if k, v, ok := strings.Cut(f, ": "); ok {
				if _, known := values[k]; !known {
					keys = append(keys, k)
				}
				values[k] = v
			}
		}
		var parts []string
		for _, k := range keys {
			parts = append(parts, k+": "+values[k])
		}
		return service + "  - {" + strings.Join(parts, ", ") + "}\n"
	}
	for _, tc := range []struct{ file, want string }{
		{"services: {}\ntools: []\n", "no tools"},
		{"tools: [{name: t}]\nextra: 1\n", "unknown field"},
		{tool("retry_mode: sometimes"), "retry_mode"},
		{tool("idempotency_key: false"), "only a key makes its retry safe"},
		{tool("service: bare; retry_mode: financial"), "needs operations"},
		{tool("service: nowhere"), "not among the file's services"},
		{tool("method: GET"), "method"},
		{tool("path: '/v1/x/{id}'"), "path parameter id must be a required property"},
		{tool("path: '/v1/x/a{id}'"), "whole segment"},
		{tool("input_schema: {type: object, properties: {action_id: {type: string}}}"), "action_id"},
		{tool("input_schema: {type: array}"), "type: object"},
		{tool("input_schema: {type: object, properties: {n: {type: integer, minimum: x}}}"), "not a valid JSON Schema"},
		{tool("input_schema: {type: object, properties: {n: {$ref: 'https://example.com/s.json'}}}"), "not loaded"},
		{tool("approval: true"), "takes approvals"},
		{tool("name: get_operation"), "not one of"},
		{tool("summary: ''"), "summary"},
		{tool("kind: request_approval; service: ''"), "request_approval"},
		{tool("") + "  - {name: t, summary: S., service: s, method: POST, path: /v1/y, retry_mode: create, input_schema: {type: object}}\n", "declared twice"},
	} {
		_, err := agent.ParseTools([]byte(tc.file))
		if !errors.Is(err, agent.ErrToolsFile) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\n=> %v; want an ErrToolsFile naming %q", tc.file, err, tc.want)
		}
	}
	if _, err := agent.ParseTools([]byte(tool(""))); err != nil {
		t.Errorf("the minimal tool: %v", err)
	}
}
