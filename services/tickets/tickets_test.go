package tickets_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/services/tickets"
)

func setup(t *testing.T) (*apitest.Client, *servicetest.Env) {
	t.Helper()
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return env.Serve(t, svc), env
}

// count runs a SELECT count(*) in the test's schema.
func count(t *testing.T, env *servicetest.Env, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := env.DB.Raw(query, args...).Scan(&n).Error; err != nil {
		t.Fatalf("count %q: %v", query, err)
	}
	return n
}

const ticketBody = `{"project":"ops","title":"Rotate staging certificate","priority":"high"}`

func TestCreateReturnsTicketAndOperation(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	res := c.Post("/v1/tickets", ticketBody, apitest.Key("create-1")).Status(t, http.StatusCreated)
	var got tickets.CreateResult
	res.Decode(t, &got)
	if got.Status != tickets.StatusOpen || got.Priority != tickets.PriorityHigh || got.Deduplicated || got.SourceEventID != nil {
		t.Fatalf("unexpected ticket %+v", got)
	}
	if res.Header.Get("Location") != "/v1/tickets/"+got.ID {
		t.Errorf("Location = %q", res.Header.Get("Location"))
	}
	opID := res.Header.Get("Operation-Id")
	op := c.Get("/v1/operations/"+opID).Status(t, http.StatusOK).JSON(t)
	if op["state"] != "succeeded" || op["kind"] != "tickets.create" {
		t.Errorf("operation = %v", op)
	}
	if r := op["resource"].(map[string]any); r["id"] != got.ID || r["type"] != "ticket" {
		t.Errorf("operation resource = %v", r)
	}
	c.Get("/v1/tickets/"+got.ID).Status(t, http.StatusOK)
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 1 {
		t.Fatalf("tickets = %d, want 1", n)
	}
	// The defaults are part of the command: an omitted priority is "normal".
	res = c.Post("/v1/tickets", `{"project":"ops","title":"defaults"}`, apitest.Key("create-2")).Status(t, http.StatusCreated)
	if p := res.Str(t, "priority"); p != "normal" {
		t.Errorf("default priority = %q", p)
	}
}

// lossyProxy forwards each request to target and then closes the client's connection without relaying the
// response: the server completes, the caller never hears back.
func lossyProxy(t *testing.T, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer client.Close()
				server, err := net.Dial("tcp", strings.TrimPrefix(target, "http://"))
				if err != nil {
					return
				}
				defer server.Close()
				go io.Copy(server, client)
				// Read the whole response from the server, then drop it.
				buf := make([]byte, 4096)
				for {
					n, err := server.Read(buf)
					if err != nil || (n > 0 && strings.Contains(string(buf[:n]), "\r\n\r\n")) {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

func TestResponseLostThenRetryReplays(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	lost := apitest.New(t, lossyProxy(t, env.URL), servicetest.AgentSecret)
	if _, err := lost.Try(http.MethodPost, "/v1/tickets", ticketBody, apitest.Key("lost-1")); err == nil {
		t.Fatal("the proxy relayed a response; the test cannot show a lost answer")
	}
	// The server finished: the ticket exists although the caller never heard.
	servicetest.Eventually(t, "the server finished the lost request", func() bool { return count(t, env, `SELECT count(*) FROM tickets`) == 1 })

	res := c.Post("/v1/tickets", ticketBody, apitest.Key("lost-1")).Status(t, http.StatusCreated)
	if res.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry was not a replay")
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 1 {
		t.Fatalf("tickets = %d after the retry, want 1", n)
	}
}

func TestConcurrentCopiesOfOneKeyCreateOneTicket(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	const copies = 100
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		mu       sync.Mutex
		statuses = map[int]int{}
		bodies   = map[string]int{}
		fresh    int
	)
	for range copies {
		wg.Go(func() {
			<-start
			res := c.Post("/v1/tickets", ticketBody, apitest.Key("same-key"))
			mu.Lock()
			defer mu.Unlock()
			statuses[res.Code]++
			bodies[string(res.Body)]++
			if res.Header.Get("Idempotent-Replayed") != "true" {
				fresh++
			}
		})
	}
	close(start)
	wg.Wait()
	if statuses[http.StatusCreated] != copies {
		t.Errorf("statuses = %v, want %d x 201", statuses, copies)
	}
	if len(bodies) != 1 {
		t.Errorf("%d different bodies, want every copy to see the same ticket", len(bodies))
	}
	if fresh != 1 {
		t.Errorf("%d responses were not replays, want exactly 1", fresh)
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 1 {
		t.Fatalf("tickets = %d, want 1", n)
	}
	if n := count(t, env, `SELECT count(*) FROM operations`); n != 1 {
		t.Fatalf("operations = %d, want 1", n)
	}
	if n := count(t, env, `SELECT count(*) FROM operation_events WHERE type = 'replayed'`); n != copies-1 {
		t.Errorf("replayed events = %d, want %d", n, copies-1)
	}
}

func TestRestartedCallerReplays(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	first := c.Post("/v1/tickets", ticketBody, apitest.Key("restart-1")).Status(t, http.StatusCreated)
	// A new process: a new client with no connection or memory shared with the first, only the stored key.
	restarted := apitest.New(t, env.URL, servicetest.AgentSecret)
	again := restarted.Post("/v1/tickets", ticketBody, apitest.Key("restart-1")).Status(t, http.StatusCreated)
	if string(again.Body) != string(first.Body) {
		t.Errorf("replay body differs:\n%s\n%s", first.Body, again.Body)
	}
	if again.Header.Get("Idempotent-Replayed") != "true" || again.Header.Get("Operation-Id") != first.Header.Get("Operation-Id") {
		t.Errorf("replay headers = %v", again.Header)
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 1 {
		t.Fatalf("tickets = %d, want 1", n)
	}
}

func TestChangedBodyIsRefusedEquivalentJSONReplays(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	first := c.Post("/v1/tickets", ticketBody, apitest.Key("k")).Status(t, http.StatusCreated)

	changed := c.Post("/v1/tickets", `{"project":"ops","title":"Rotate PRODUCTION certificate","priority":"high"}`, apitest.Key("k")).
		Status(t, http.StatusUnprocessableEntity).JSON(t)
	if changed["code"] != "idempotency_key_reused" || changed["operation_id"] != first.Header.Get("Operation-Id") || changed["state"] != "succeeded" {
		t.Errorf("conflict = %v", changed)
	}
	if _, leaked := changed["project"]; leaked {
		t.Error("the conflict leaked the stored body")
	}
	var title string
	env.DB.Raw(`SELECT title FROM tickets`).Scan(&title)
	if title != "Rotate staging certificate" || count(t, env, `SELECT count(*) FROM tickets`) != 1 {
		t.Fatalf("the conflicting request changed something: title %q", title)
	}

	for _, equivalent := range []string{
		"{ \"priority\" : \"high\",\n \"title\":\"Rotate staging certificate\", \"project\":\"ops\" }",
		`{"project":"ops","title":"Rotate staging certificate","priority":"high","description":""}`, // default spelled out
		`{"project":"ops","title":"Rotate staging certificate","priority":"\u0068igh"}`,             // another escape
	} {
		res := c.Post("/v1/tickets", equivalent, apitest.Key("k")).Status(t, http.StatusCreated)
		if res.Header.Get("Idempotent-Replayed") != "true" || string(res.Body) != string(first.Body) {
			t.Errorf("equivalent JSON %s was not replayed byte for byte", equivalent)
		}
	}
	ops := c.Get("/v1/operations?idempotency_key=k").Status(t, http.StatusOK).JSON(t)["items"].([]any)
	var types []string
	for _, ev := range ops[0].(map[string]any)["events"].([]any) {
		types = append(types, ev.(map[string]any)["type"].(string))
	}
	if got := strings.Join(types, ","); got != "completed,conflict_rejected,replayed,replayed,replayed" {
		t.Errorf("event history = %s", got)
	}
}

func TestSameSourceEventUnderManyKeysMakesOneTicket(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	const racers = 50
	body := `{"project":"ops","title":"Disk full on db-3","source_event_id":"alert-7781"}`
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		mu      sync.Mutex
		created int
		dedup   int
		ids     = map[string]bool{}
	)
	for i := range racers {
		wg.Go(func() {
			<-start
			res := c.Post("/v1/tickets", body, apitest.Key(fmt.Sprintf("alert-key-%d", i)))
			var got tickets.CreateResult
			res.Decode(t, &got)
			mu.Lock()
			defer mu.Unlock()
			ids[got.ID] = true
			switch {
			case res.Code == http.StatusCreated && !got.Deduplicated:
				created++
			case res.Code == http.StatusOK && got.Deduplicated:
				dedup++
			default:
				t.Errorf("status %d deduplicated=%v", res.Code, got.Deduplicated)
			}
		})
	}
	close(start)
	wg.Wait()
	if created != 1 || dedup != racers-1 || len(ids) != 1 {
		t.Errorf("created=%d deduplicated=%d distinct ids=%d", created, dedup, len(ids))
	}
	if n := count(t, env, `SELECT count(*) FROM tickets WHERE source_event_id = 'alert-7781'`); n != 1 {
		t.Fatalf("tickets = %d, want 1", n)
	}
	list := c.Get("/v1/tickets?source_event_id=alert-7781").Status(t, http.StatusOK).JSON(t)["items"].([]any)
	if len(list) != 1 {
		t.Errorf("lookup by source_event_id found %d", len(list))
	}
}

func TestAccountsAreIsolated(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	other := c.As(servicetest.OtherAgentSecret)
	mine := c.Post("/v1/tickets", ticketBody, apitest.Key("shared-key")).Status(t, http.StatusCreated)
	theirs := other.Post("/v1/tickets", `{"project":"web","title":"Something else"}`, apitest.Key("shared-key")).Status(t, http.StatusCreated)
	if theirs.Header.Get("Idempotent-Replayed") == "true" || mine.Str(t, "id") == theirs.Str(t, "id") {
		t.Fatal("the same key in another account was not independent")
	}
	id := mine.Str(t, "id")
	other.Get("/v1/tickets/"+id).Status(t, http.StatusNotFound)
	other.Post("/v1/tickets/"+id+"/comments", `{"body":"hi"}`, apitest.Key("c1")).Status(t, http.StatusNotFound)
	other.Put("/v1/tickets/"+id+"/status", `{"status":"closed"}`).Status(t, http.StatusNotFound)
	other.Get("/v1/operations/"+mine.Header.Get("Operation-Id")).Status(t, http.StatusNotFound)
	if items := other.Get("/v1/tickets").JSON(t)["items"].([]any); len(items) != 1 {
		t.Errorf("other account lists %d tickets, want its own 1", len(items))
	}
	var status string
	env.DB.Raw(`SELECT status FROM tickets WHERE id = ?`, id).Scan(&status)
	if status != "open" || count(t, env, `SELECT count(*) FROM ticket_comments`) != 0 {
		t.Fatal("another account changed my ticket")
	}
}

func TestRejectedRequestsDoNotBurnTheKey(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	cases := []struct {
		name, body string
		status     int
		code       string
	}{
		{"missing title", `{"project":"ops"}`, 422, "validation_failed"},
		{"bad priority", `{"project":"ops","title":"t","priority":"asap"}`, 422, "validation_failed"},
		{"malformed", `{"project":"ops","title":`, 400, "invalid_request"},
		{"unknown field", `{"project":"ops","title":"t","assignee":"bob"}`, 400, "invalid_request"},
		{"wrong type", `{"project":"ops","title":7}`, 400, "invalid_request"},
		{"trailing data", `{"project":"ops","title":"t"} {}`, 400, "invalid_request"},
		{"not an object", `["ops"]`, 400, "invalid_request"},
	}
	for _, tc := range cases {
		res := c.Post("/v1/tickets", tc.body, apitest.Key("reused-after-errors")).Status(t, tc.status)
		if got := res.Str(t, "code"); got != tc.code {
			t.Errorf("%s: code %q, want %q", tc.name, got, tc.code)
		}
		if res.Header.Get("Content-Type") != "application/problem+json" || res.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s: headers %v", tc.name, res.Header)
		}
	}
	if n := count(t, env, `SELECT count(*) FROM operations WHERE key_state IS NOT NULL`); n != 0 {
		t.Fatalf("rejected requests stored %d keys", n)
	}
	c.Post("/v1/tickets", ticketBody, apitest.Key("reused-after-errors")).Status(t, http.StatusCreated)

	fields := c.Post("/v1/tickets", `{"project":"","title":""}`, apitest.Key("x")).Status(t, 422).JSON(t)["errors"].([]any)
	if len(fields) != 2 {
		t.Errorf("validation errors = %v, want project and title", fields)
	}
}

func TestIdempotencyKeyIsRequiredAndChecked(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	if code := c.Post("/v1/tickets", ticketBody).Status(t, 400).Str(t, "code"); code != "idempotency_key_missing" {
		t.Errorf("missing key: %s", code)
	}
	for _, bad := range []string{"", strings.Repeat("k", 256), "tab\there", "ключ"} {
		res := c.Post("/v1/tickets", ticketBody, apitest.Key(bad))
		// An empty header value is still a header that is present.
		if res.Code != 400 || (res.Str(t, "code") != "idempotency_key_invalid" && res.Str(t, "code") != "idempotency_key_missing") {
			t.Errorf("key %q: %d %s", bad, res.Code, res.Body)
		}
	}
	c.Post("/v1/tickets", ticketBody, apitest.Key(strings.Repeat("k", 255))).Status(t, 201)
	if n := count(t, env, `SELECT count(*) FROM tickets`); n != 1 {
		t.Fatalf("tickets = %d, want 1", n)
	}
	c.As("").Post("/v1/tickets", ticketBody, apitest.Key("k")).Status(t, 401)
	c.As("not-a-key").Post("/v1/tickets", ticketBody, apitest.Key("k")).Status(t, 401)
}

func TestCommentReplayAddsNoSecondComment(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	id := c.Post("/v1/tickets", ticketBody, apitest.Key("t")).Status(t, 201).Str(t, "id")
	first := c.Post("/v1/tickets/"+id+"/comments", `{"body":"Renewed, waiting for DNS"}`, apitest.Key("comment-1")).Status(t, 201)
	again := c.Post("/v1/tickets/"+id+"/comments", `{"body":"Renewed, waiting for DNS"}`, apitest.Key("comment-1")).Status(t, 201)
	if again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
		t.Error("comment retry was not a replay")
	}
	// The same key for the same text on another ticket is another request.
	id2 := c.Post("/v1/tickets", `{"project":"ops","title":"second"}`, apitest.Key("t2")).Status(t, 201).Str(t, "id")
	c.Post("/v1/tickets/"+id2+"/comments", `{"body":"Renewed, waiting for DNS"}`, apitest.Key("comment-1")).Status(t, 422)
	// A comment on a ticket that does not exist is 404 and leaves the key free.
	c.Post("/v1/tickets/tkt_missing/comments", `{"body":"x"}`, apitest.Key("comment-2")).Status(t, 404)
	c.Post("/v1/tickets/"+id+"/comments", `{"body":"x"}`, apitest.Key("comment-2")).Status(t, 201)

	if n := count(t, env, `SELECT count(*) FROM ticket_comments WHERE ticket_id = ?`, id); n != 2 {
		t.Fatalf("comments = %d, want 2", n)
	}
	if items := c.Get("/v1/tickets/"+id+"/comments").Status(t, 200).JSON(t)["items"].([]any); len(items) != 2 {
		t.Errorf("listed %d comments", len(items))
	}
}

func TestDeclaredStatusRecordsOneChange(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	id := c.Post("/v1/tickets", ticketBody, apitest.Key("t")).Status(t, 201).Str(t, "id")
	for range 3 {
		if s := c.Put("/v1/tickets/"+id+"/status", `{"status":"resolved"}`).Status(t, 200).Str(t, "status"); s != "resolved" {
			t.Fatalf("status = %s", s)
		}
	}
	c.Put("/v1/tickets/"+id+"/status", `{"status":"reopened"}`).Status(t, 422)
	if n := count(t, env, `SELECT count(*) FROM ticket_status_changes WHERE ticket_id = ?`, id); n != 1 {
		t.Fatalf("status changes = %d, want 1", n)
	}
	c.Put("/v1/tickets/"+id+"/status", `{"status":"closed"}`).Status(t, 200)
	changes := c.Get("/v1/tickets/"+id+"/status_changes").Status(t, 200).JSON(t)["items"].([]any)
	if len(changes) != 2 || changes[1].(map[string]any)["from"] != "resolved" {
		t.Errorf("changes = %v", changes)
	}
}

func TestStoreDownIs503AndNothingElse(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	// A database nobody listens on: every query fails to connect.
	down, err := gorm.Open(postgres.Open("postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"),
		&gorm.Config{Logger: gormlogger.Discard, DisableAutomaticPing: true})
	if err != nil {
		t.Fatal(err)
	}
	env.Idem.DB, env.Deps.DB = down, down
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := env.Serve(t, svc)
	res := c.Post("/v1/tickets", ticketBody, apitest.Key("k")).Status(t, http.StatusServiceUnavailable)
	if res.Str(t, "code") != "store_unavailable" || res.Header.Get("Retry-After") == "" {
		t.Errorf("store down answered %s %v", res.Body, res.Header)
	}
	c.Get("/v1/tickets/tkt_0193c1c5-0000-7000-8000-000000000000").Status(t, http.StatusServiceUnavailable)
}

func TestProblemDocumentShape(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	var doc map[string]any
	json.Unmarshal(c.Get("/v1/tickets/nope").Status(t, 404).Body, &doc)
	for _, member := range []string{"type", "title", "status", "detail", "code"} {
		if _, ok := doc[member]; !ok {
			t.Errorf("problem lacks %q: %v", member, doc)
		}
	}
}

func TestTwoIdempotencyKeysAreRefused(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	res := c.Post("/v1/tickets", ticketBody, func(r *http.Request) {
		r.Header.Add("Idempotency-Key", "a")
		r.Header.Add("Idempotency-Key", "b")
	}).Status(t, http.StatusBadRequest)
	if res.Str(t, "code") != "idempotency_key_invalid" || count(t, env, `SELECT count(*) FROM tickets`) != 0 {
		t.Fatalf("two keys: %s", res.Body)
	}
}

func TestOversizedBodyIsRefusedAndHealthEndpoints(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	huge := `{"project":"ops","title":"t","description":"` + strings.Repeat("x", 2<<20) + `"}`
	if code := c.Post("/v1/tickets", huge, apitest.Key("big")).Status(t, http.StatusRequestEntityTooLarge).Str(t, "code"); code != "body_too_large" {
		t.Errorf("code = %s", code)
	}
	if n := count(t, env, `SELECT count(*) FROM operations WHERE key_state IS NOT NULL`); n != 0 {
		t.Fatalf("an oversized request stored a key")
	}
	anon := c.As("")
	anon.Get("/healthz").Status(t, http.StatusOK)
	anon.Get("/readyz").Status(t, http.StatusOK)
}

// TestAttemptsOfOneOperationAreToldApart: each HTTP attempt has an id (the caller's own, or one the server
// makes), echoed back and written in the events it causes, so the history says which attempt did what.
func TestAttemptsOfOneOperationAreToldApart(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	first := c.Post("/v1/tickets", ticketBody, apitest.Key("op-7f2c"), apitest.Header("Attempt-Id", "att_01")).Status(t, 201)
	if first.Header.Get("Attempt-Id") != "att_01" {
		t.Errorf("Attempt-Id echoed as %q", first.Header.Get("Attempt-Id"))
	}
	second := c.Post("/v1/tickets", ticketBody, apitest.Key("op-7f2c"), apitest.Header("Attempt-Id", "att_02")).Status(t, 201)
	third := c.Post("/v1/tickets", ticketBody, apitest.Key("op-7f2c")).Status(t, 201) // no id: the server makes one
	made := third.Header.Get("Attempt-Id")
	if !strings.HasPrefix(made, "att_") || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("server-made attempt id %q", made)
	}
	var op struct {
		Events []struct {
			Type   string         `json:"type"`
			Detail map[string]any `json:"detail"`
		} `json:"events"`
	}
	c.Get("/v1/operations/"+first.Header.Get("Operation-Id")).Status(t, 200).Decode(t, &op)
	var got []string
	for _, ev := range op.Events {
		got = append(got, fmt.Sprintf("%s:%v", ev.Type, ev.Detail["attempt_id"]))
	}
	want := "completed:att_01,replayed:att_02,replayed:" + made
	if strings.Join(got, ",") != want {
		t.Fatalf("history %v, want %s", got, want)
	}
}

// TestTextThatCouldMisleadAPersonIsRefused: control, bidirectional and zero-width characters in any free-text
// field are 422 naming the field, with nothing stored and the key still free; line feed and tab are allowed in
// the multi-line fields (description, comment body) and nowhere else.
func TestTextThatCouldMisleadAPersonIsRefused(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	for _, tc := range []struct{ body, field string }{
		{`{"project":"ops","title":` + quote("refund \u202e01 erutpac") + `}`, "title"},
		{`{"project":"ops","title":` + quote("a\u2066b\u2069") + `}`, "title"},
		{`{"project":` + quote("o\u200bps") + `,"title":"t"}`, "project"},
		{`{"project":"ops","title":` + quote("two\nlines") + `}`, "title"},
		{`{"project":"ops","title":` + quote("bell\u0007") + `}`, "title"},
		{`{"project":"ops","title":` + quote("c1\u009b31m") + `}`, "title"},
		{`{"project":"ops","title":"t","description":` + quote("\ufeffhidden") + `}`, "description"},
		{`{"project":"ops","title":"t","description":` + quote("carriage\rreturn") + `}`, "description"},
		{`{"project":"ops","title":"t","source_event_id":` + quote("evt\u200d1") + `}`, "source_event_id"},
		{`{"project":"ops","title":` + quote(strings.Repeat("t", 201)) + `}`, "title"},
		// Invisible to a person, read by a model or a matcher: tags, soft hyphen, Hangul filler, variation
		// selector, noncharacter.
		{`{"project":"ops","title":` + quote("ok\U000e0069\U000e0067\U000e006e\U000e006f\U000e0072\U000e0065") + `}`, "title"},
		{`{"project":"ops","title":"t","description":` + quote("pass\u00adword") + `}`, "description"},
		{`{"project":` + quote("ops\u3164") + `,"title":"t"}`, "project"},
		{`{"project":"ops","title":` + quote("ok\ufe0f") + `}`, "title"},
		{`{"project":"ops","title":"t","source_event_id":` + quote("evt\ufffe") + `}`, "source_event_id"},
	} {
		res := c.Post("/v1/tickets", tc.body, apitest.Key("text")).Status(t, http.StatusUnprocessableEntity)
		var doc struct{ Errors []problem.FieldError }
		res.Decode(t, &doc)
		if len(doc.Errors) != 1 || doc.Errors[0].Field != tc.field {
			t.Errorf("%s: %s; want one error naming %s", tc.body, res.Body, tc.field)
		}
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`) + count(t, env, `SELECT count(*) FROM operations WHERE key_state IS NOT NULL`); n != 0 {
		t.Fatalf("%d tickets and keys stored from refused requests", n)
	}
	created := c.Post("/v1/tickets", `{"project":"ops","title":"t","description":"line one\n\tline two"}`, apitest.Key("text")).
		Status(t, http.StatusCreated)
	id := created.Str(t, "id")
	c.Post("/v1/tickets/"+id+"/comments", `{"body":`+quote("see \u202eexe.txt")+`}`, apitest.Key("comment")).Status(t, http.StatusUnprocessableEntity)
	c.Post("/v1/tickets/"+id+"/comments", `{"body":"first line\nsecond line"}`, apitest.Key("comment")).Status(t, http.StatusCreated)
	if n := count(t, env, `SELECT count(*) FROM ticket_comments`); n != 1 {
		t.Fatalf("%d comments, want the one with clean text", n)
	}
}

// TestHostileJSONIsRefusedBeforeAnythingIsStored: a body nested 100,000 levels (200 KB) is 400 at once, and
// a lone surrogate escape in a source_event_id, which encoding/json would store as U+FFFD and so make
// "\ud800" and "\udbff" one event, is 400 naming the field; neither leaves a ticket, an operation or a key.
// The same body with its text escaped as a whole pair is created.
func TestHostileJSONIsRefusedBeforeAnythingIsStored(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	deep := `{"project":"p","title":"t","x":` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `}`
	for _, tc := range []struct{ body, field string }{
		{deep, ""},
		{`{"project":"p","title":"t","source_event_id":"evt-\ud800"}`, "source_event_id"},
		{`{"project":"p","title":"t","source_event_id":"evt-\udbff"}`, "source_event_id"},
		{`{"project":"p","title":"\udc00t"}`, "title"},
	} {
		res := c.Post("/v1/tickets", tc.body, apitest.Key("hostile-json")).Status(t, http.StatusBadRequest)
		var doc struct {
			Code   string
			Errors []problem.FieldError
		}
		res.Decode(t, &doc)
		if doc.Code != "invalid_request" || (tc.field != "" && (len(doc.Errors) != 1 || doc.Errors[0].Field != tc.field)) {
			t.Errorf("%.80s: %s; want invalid_request naming %q", tc.body, res.Body, tc.field)
		}
	}
	if n := count(t, env, `SELECT count(*) FROM tickets`) + count(t, env, `SELECT count(*) FROM operations`); n != 0 {
		t.Fatalf("%d tickets and operations stored from refused bodies", n)
	}
	c.Post("/v1/tickets", `{"project":"p","title":"t","source_event_id":"evt-\ud83d\ude00"}`, apitest.Key("hostile-json")).
		Status(t, http.StatusCreated)
}

// TestListsPageWithACursor: every list pages by limit and an opaque cursor; walking the pages of tickets and of
// comments gives every item once, in order, and the last page has no next_cursor; a bad limit or cursor is 400.
func TestListsPageWithACursor(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	var ids []string
	for i := range 5 {
		res := c.Post("/v1/tickets", fmt.Sprintf(`{"project":"ops","title":"t%d"}`, i), apitest.Key(fmt.Sprint("page-", i))).Status(t, http.StatusCreated)
		ids = append([]string{res.Str(t, "id")}, ids...) // newest first
	}
	walk := func(path string) []string {
		var got []string
		next := ""
		for pages := 0; ; pages++ {
			url := path + "?limit=2"
			if next != "" {
				url += "&cursor=" + next
			}
			var p struct {
				Items      []struct{ ID string }
				NextCursor *string `json:"next_cursor"`
			}
			c.Get(url).Status(t, http.StatusOK).Decode(t, &p)
			if len(p.Items) > 2 || pages > 5 {
				t.Fatalf("%s: page %d has %d items", path, pages, len(p.Items))
			}
			for _, it := range p.Items {
				got = append(got, it.ID)
			}
			if p.NextCursor == nil {
				return got
			}
			next = *p.NextCursor
		}
	}
	if got := walk("/v1/tickets"); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Errorf("tickets by page: %v, want %v", got, ids)
	}
	var comments []string
	for i := range 3 {
		comments = append(comments, c.Post("/v1/tickets/"+ids[0]+"/comments", fmt.Sprintf(`{"body":"c%d"}`, i), apitest.Key(fmt.Sprint("cm-", i))).
			Status(t, http.StatusCreated).Str(t, "id"))
	}
	if got := walk("/v1/tickets/" + ids[0] + "/comments"); fmt.Sprint(got) != fmt.Sprint(comments) {
		t.Errorf("comments by page: %v, want %v", got, comments)
	}
	for _, status := range []string{"resolved", "open", "closed"} {
		c.Put("/v1/tickets/"+ids[0]+"/status", `{"status":"`+status+`"}`).Status(t, http.StatusOK)
	}
	var first, second struct {
		Items      []tickets.StatusChange
		NextCursor *string `json:"next_cursor"`
	}
	c.Get("/v1/tickets/"+ids[0]+"/status_changes?limit=2").Status(t, http.StatusOK).Decode(t, &first)
	if len(first.Items) != 2 || first.NextCursor == nil || first.Items[0].To != tickets.StatusResolved {
		t.Fatalf("first page of status changes: %+v", first)
	}
	c.Get("/v1/tickets/"+ids[0]+"/status_changes?limit=2&cursor="+*first.NextCursor).Status(t, http.StatusOK).Decode(t, &second)
	if len(second.Items) != 1 || second.NextCursor != nil || second.Items[0].To != tickets.StatusClosed {
		t.Fatalf("second page of status changes: %+v", second)
	}
	for _, q := range []string{"limit=0", "limit=101", "limit=x", "cursor=nope", "cursor=eyJ0IjoxfQ"} {
		if code := c.Get("/v1/tickets?"+q).Status(t, http.StatusBadRequest).Str(t, "code"); code != "invalid_request" {
			t.Errorf("%s: code %s", q, code)
		}
	}
}
