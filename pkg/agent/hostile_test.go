package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// fakeService answers every request with answer and counts what reached it: for tests whose point is what the
// agent does before or without a real service.
type fakeService struct {
	*httptest.Server
	requests atomic.Int32
}

func newFakeService(t *testing.T, answer http.HandlerFunc) *fakeService {
	t.Helper()
	f := &fakeService{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		answer(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func answerJSON(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(body))
	}
}

func (f *fakeService) config(key string) agent.Config {
	return agent.Config{TicketsURL: f.URL, PaymentsURL: f.URL, DeploysURL: f.URL, APIKey: key,
		BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond, Warn: func(string) {}}
}

func (f *fakeService) open(t *testing.T, path string, cfg agent.Config) *agent.Agent {
	t.Helper()
	a, err := agent.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// A journal begun under one account's key, its agent killed after sending, is not resumed under another
// account's key: there the service has no record of the operation and would do it again. Open refuses, and
// sends and writes nothing; the key the operation was made with resumes it.
func TestResumeUnderAnotherAccountsKeyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stop := errors.New("died")
	other, err := agent.Open(b.journal, agent.Config{TicketsURL: b.env.URL, APIKey: servicetest.OtherAgentSecret,
		HTTPClient: &http.Client{Transport: b.fault}, Hook: func(p string) {
			if p == "after_answer" {
				panic(stop)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != stop {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = other.Do(context.Background(), "b", "create_ticket", ticketArgs("made in B"), agent.DoOptions{})
	}()
	other.Close()
	before := readFile(t, b.journal)
	inAccount := func(account string) int {
		var n int
		if err := b.env.DB.Raw(`SELECT count(*) FROM tickets WHERE title = 'made in B' AND account_id = ?`, account).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}

	a, err := agent.Open(b.journal, agent.Config{TicketsURL: b.env.URL, APIKey: servicetest.AgentSecret,
		HTTPClient: &http.Client{Transport: b.fault}, BackoffBase: time.Millisecond})
	if err == nil {
		_, _ = a.Resume(t.Context())
		_, _ = a.Do(t.Context(), "b", "create_ticket", ticketArgs("made in B"), agent.DoOptions{})
		a.Close()
	}
	if !errors.Is(err, agent.ErrOtherPrincipal) || !strings.Contains(err.Error(), "--same-account") {
		t.Errorf("Open under another account's key = %v; want ErrOtherPrincipal, saying how to go on", err)
	}
	if n := inAccount(servicetest.AccountDemo); n != 0 || b.fault.writes.Load() != 1 {
		t.Errorf("%d tickets in the other account, %d writes; want 0 and only the first agent's 1", n, b.fault.writes.Load())
	}
	if after := readFile(t, b.journal); !bytes.Equal(after, before) {
		t.Errorf("the refused agent wrote %d bytes to the journal", len(after)-len(before))
	}

	b2 := b.openWith(t, servicetest.OtherAgentSecret)
	results, err := b2.Resume(t.Context())
	if err != nil || len(results) != 1 || results[0].State != agent.StateSucceeded {
		t.Fatalf("Resume with the key the operation was made with = %+v, %v; want it succeeded", results, err)
	}
	if n := inAccount(servicetest.AccountOther); n != 1 {
		t.Errorf("%d tickets in the account that made it; want 1", n)
	}
	op, _ := b2.Operation("b")
	if op.Principal == nil || op.Principal.KeyID == "" || bytes.Contains(readFile(t, b.journal), []byte(servicetest.OtherAgentSecret)) {
		t.Errorf("operation principal %+v; want a key id, and no secret in the journal", op.Principal)
	}
}

func (b *bundle) openWith(t *testing.T, key string) *agent.Agent {
	t.Helper()
	a, err := agent.Open(b.journal, agent.Config{TicketsURL: b.env.URL, APIKey: key,
		HTTPClient: &http.Client{Transport: b.fault}, BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// A new key of the same account (a rotated key) goes on with the journal once the operator says so; the
// journal then belongs to the new key, and the old one is refused.
func TestSameAccountAdoptsTheJournal(t *testing.T) {
	t.Parallel()
	f := newFakeService(t, answerJSON(http.StatusCreated, `{"id":"tkt_1","operation_id":"op_1"}`))
	path := filepath.Join(t.TempDir(), "rotated.journal")
	old := f.open(t, path, f.config("old-key-of-acct"))
	if res, err := old.Do(t.Context(), "t", "create_ticket", ticketArgs("rotated"), agent.DoOptions{}); err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("Do = %+v, %v", res, err)
	}
	old.Close()

	if _, err := agent.Open(path, f.config("new-key-of-acct")); !errors.Is(err, agent.ErrOtherPrincipal) {
		t.Fatalf("Open under a new key = %v; want ErrOtherPrincipal", err)
	}
	cfg := f.config("new-key-of-acct")
	cfg.SameAccount = true
	adopted := f.open(t, path, cfg)
	if res, err := adopted.Do(t.Context(), "t", "create_ticket", ticketArgs("rotated"), agent.DoOptions{}); err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("Do again under the adopted key = %+v, %v; want its settled answer", res, err)
	}
	adopted.Close()
	if !bytes.Contains(readFile(t, path), []byte(`"type":"principal_adopted"`)) {
		t.Error("the journal does not record that the new key was adopted")
	}
	f.open(t, path, f.config("new-key-of-acct")).Close()
	if _, err := agent.Open(path, f.config("old-key-of-acct")); !errors.Is(err, agent.ErrOtherPrincipal) {
		t.Errorf("Open under the old key after the journal adopted the new one = %v; want ErrOtherPrincipal", err)
	}
	if n := f.requests.Load(); n != 1 {
		t.Errorf("%d requests; want the first 1 only", n)
	}
}

// writeJournal writes bodies as a journal of chain name, the way an agent before keys were recorded did.
func writeJournal(t *testing.T, path, name string, bodies ...map[string]any) {
	t.Helper()
	c := &auditchain.Chain{Name: name}
	var out []byte
	for _, body := range bodies {
		rec, err := c.Append(body)
		if err != nil {
			t.Fatal(err)
		}
		line, _ := json.Marshal(struct {
			Chain  string          `json:"chain"`
			Seq    int64           `json:"seq"`
			Prev   string          `json:"prev"`
			Hash   string          `json:"hash"`
			Record json.RawMessage `json:"record"`
		}{rec.Chain, rec.Seq, rec.Prev, rec.Hash, rec.Body})
		out = append(append(out, line...), '\n')
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A journal from before agents recorded their key cannot say whose its operations are: it is resumed only when
// the operator says the key is of their account, and from then on it belongs to that key.
func TestJournalWithoutKeysIsResumedOnlyWhenTheOperatorSaysSo(t *testing.T) {
	t.Parallel()
	f := newFakeService(t, answerJSON(http.StatusCreated, `{"id":"tkt_1","operation_id":"op_1"}`))
	path := filepath.Join(t.TempDir(), "old.journal")
	at := auditchain.FormatTime(time.Now())
	writeJournal(t, path, "jnl_old",
		map[string]any{"type": agent.RecJournalOpened, "at": at, "format": 1},
		map[string]any{"type": agent.RecRunStarted, "run_id": "run_old", "command": "agent do", "started_at": at},
		map[string]any{"type": agent.RecOperationCreated, "operation_id": "aop_old", "action_id": "old", "idempotency_key": "idk_old",
			"tool": "create_ticket", "service": agent.Tickets, "method": "POST", "route_template": "/v1/tickets", "path": "/v1/tickets",
			"args": map[string]any{"project": "ops", "title": "old"}, "fingerprint": "f", "retry_mode": "create", "budget": 5,
			"authority_ref": "env:AGENT_API_KEY", "run_id": "run_old", "at": at})
	before := readFile(t, path)

	if _, err := agent.Open(path, f.config("some-key")); !errors.Is(err, agent.ErrOtherPrincipal) {
		t.Fatalf("Open of a journal without keys = %v; want ErrOtherPrincipal", err)
	}
	if !bytes.Equal(readFile(t, path), before) || f.requests.Load() != 0 {
		t.Fatalf("the refused agent wrote to the journal or sent %d requests", f.requests.Load())
	}
	cfg := f.config("some-key")
	cfg.SameAccount = true
	a := f.open(t, path, cfg)
	results, err := a.Resume(t.Context())
	if err != nil || len(results) != 1 || results[0].State != agent.StateSucceeded || f.requests.Load() != 1 {
		t.Fatalf("Resume after the operator's word = %+v, %v, %d requests; want one send, succeeded", results, err, f.requests.Load())
	}
	a.Close()
	if _, err := agent.Open(path, f.config("another-key")); !errors.Is(err, agent.ErrOtherPrincipal) {
		t.Errorf("Open under another key after the adoption = %v; want ErrOtherPrincipal", err)
	}
	if rep, err := agent.VerifyJournal(path); err != nil || !rep.Intact() {
		t.Errorf("journal after the adoption: %+v, %v", rep, err)
	}
}

// A file that is not a journal is refused and left byte for byte as it was: a first line that is not a record
// (with or without its newline), a symbolic link (to such a file, to a journal, or to nothing), a FIFO. A
// torn first record, the one thing an agent may have left, is still discarded.
func TestNotAJournalIsLeftAlone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"precious":         "PRECIOUS",
		"precious-line":    "PRECIOUS\n",
		"precious-lines":   "PRECIOUS\nmore",
		"json-not-journal": `{"note":"mine"}` + "\n",
		"json-no-newline":  `{"note":"mine"}`,
		"chain-elsewhere":  `{"chain":"mine"}`,
	} {
		path := filepath.Join(dir, name)
		os.WriteFile(path, []byte(content), 0o600)
		if _, err := agent.Open(path, agent.Config{Warn: func(string) {}}); !errors.Is(err, agent.ErrNotJournal) {
			t.Errorf("%s: Open = %v; want ErrNotJournal", name, err)
		}
		if got := string(readFile(t, path)); got != content {
			t.Errorf("%s: the file now holds %q; want it unchanged", name, got)
		}
	}

	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("PRECIOUS"), 0o600)
	journal := filepath.Join(dir, "real.journal")
	a, err := agent.Open(journal, agent.Config{})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	journalBytes := readFile(t, journal)
	for link, to := range map[string]string{"link-precious": target, "link-journal": journal, "link-nowhere": filepath.Join(dir, "missing")} {
		path := filepath.Join(dir, link)
		if err := os.Symlink(to, path); err != nil {
			t.Fatal(err)
		}
		if _, err := agent.Open(path, agent.Config{}); !errors.Is(err, agent.ErrNotJournal) {
			t.Errorf("%s: Open = %v; want ErrNotJournal", link, err)
		}
	}
	if got := string(readFile(t, target)); got != "PRECIOUS" {
		t.Errorf("the symlink's target now holds %q", got)
	}
	if !bytes.Equal(readFile(t, journal), journalBytes) {
		t.Error("Open through a symlink wrote to the journal it points at")
	}
	if _, err := os.Lstat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open through a dangling symlink created its target: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Open(fifo, agent.Config{}); !errors.Is(err, agent.ErrNotJournal) {
		t.Errorf("fifo: Open = %v; want ErrNotJournal", err)
	}

	torn := filepath.Join(dir, "torn.journal")
	os.WriteFile(torn, []byte(`{"chain":"jnl_x","seq":1,"pr`), 0o600)
	a, err = agent.Open(torn, agent.Config{})
	if err != nil {
		t.Fatalf("Open of a journal whose first record was torn = %v; want it discarded", err)
	}
	a.Close()
	if rep, err := agent.VerifyJournal(torn); err != nil || !rep.Intact() {
		t.Errorf("after discarding a torn first record: %+v, %v", rep, err)
	}
}

// A journal others can write is used, with a warning: whoever can write it can change what resume sends.
func TestJournalOthersCanWriteIsWarned(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "shared.journal")
	var warnings []string
	cfg := agent.Config{Warn: func(msg string) { warnings = append(warnings, msg) }}
	a, err := agent.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if len(warnings) != 0 {
		t.Fatalf("a new journal (mode 0600) warned: %q", warnings)
	}
	for _, mode := range []os.FileMode{0o620, 0o602} {
		warnings = nil
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		a, err := agent.Open(path, cfg)
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		if len(warnings) != 1 || !strings.Contains(warnings[0], path) || !strings.Contains(warnings[0], "written by others") {
			t.Errorf("mode %v: warnings %q; want one naming the journal", mode, warnings)
		}
	}
}

// hostile is text a model or a service might supply to reach a terminal: OSC 52 (write the clipboard), a
// title change ended by BEL, CSI erase, a C1 CSI, DEL, a right-to-left override, a line break forging a line.
const hostile = "\x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x07\x1b[2J\u009b31m\x7f\u202eevil\u2066\r\n  settled succeeded: forged"

// terminalUnsafe returns the first character of s a terminal could act on, besides the line breaks show's
// own layout makes.
func terminalUnsafe(s string) (rune, bool) {
	for _, r := range s {
		if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == unicode.ReplacementChar) {
			return r, true
		}
	}
	return 0, false
}

// What a model (the action id, the arguments) and a service (a problem's code, an operation id) supplied is
// shown escaped: no escape sequence, bidirectional override or forged line reaches the terminal.
func TestShowEscapesWhatOthersSupplied(t *testing.T) {
	t.Parallel()
	code, _ := json.Marshal(hostile)
	f := newFakeService(t, answerJSON(http.StatusBadRequest, `{"type":"about:blank","status":400,"code":`+string(code)+
		`,"operation_id":`+string(code)+`}`))
	path := filepath.Join(t.TempDir(), "hostile.journal")
	a := f.open(t, path, f.config("k"))
	args, _ := json.Marshal(map[string]string{"project": "ops", "title": hostile})
	res, err := a.Do(t.Context(), "act"+hostile, "create_ticket", args, agent.DoOptions{})
	if err != nil || res.State != agent.StateRefused {
		t.Fatalf("Do = %+v, %v; want refused", res, err)
	}
	a.Close()

	j, err := agent.ReadJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	j.WriteSummary(&out)
	for _, op := range j.Operations() {
		op.WriteTimeline(&out)
	}
	if r, bad := terminalUnsafe(out.String()); bad {
		t.Errorf("show printed %U raw:\n%s", r, out.String())
	}
	if strings.Contains(out.String(), "\n  settled succeeded: forged") || !strings.Contains(out.String(), `\x1b]52;c;`) ||
		!strings.Contains(out.String(), `\u202e`) {
		t.Errorf("show did not print the hostile text escaped:\n%s", out.String())
	}
	if got := agent.Printable("plain text, ünïcödé, 日本語"); got != "plain text, ünïcödé, 日本語" {
		t.Errorf("Printable changed printable text: %q", got)
	}
	if got := agent.Printable("a\xffb"); got != `a\xffb` {
		t.Errorf("Printable(invalid UTF-8) = %q", got)
	}
}

// An approval_id that cannot travel in a header (a line break) is refused before anything is journaled or
// sent, for a new action and for one waiting for its approval; no attempt is spent as not_sent.
func TestApprovalIDWithLineBreakIsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	f := newFakeService(t, answerJSON(http.StatusPreconditionRequired,
		`{"type":"about:blank","status":428,"code":"approval_required","operation_id":"op_1"}`))
	a := f.open(t, filepath.Join(t.TempDir(), "approval.journal"), f.config("k"))
	res, err := a.Do(t.Context(), "cap", "capture_payment", json.RawMessage(`{"intent_id":"pi_1"}`), agent.DoOptions{})
	if err != nil || res.State != agent.StateNeedsHuman || f.requests.Load() != 1 {
		t.Fatalf("Do = %+v, %v; want needs_human after one request", res, err)
	}
	for _, id := range []string{"apr_1\r\nX-Injected: 1", "apr_1\n", "apr 1", "apr_1\x00"} {
		withID, _ := json.Marshal(map[string]string{"intent_id": "pi_1", "approval_id": id})
		if _, err := a.Do(t.Context(), "cap", "capture_payment", withID, agent.DoOptions{}); !errors.Is(err, agent.ErrBadArguments) {
			t.Errorf("approval_id %q for the waiting action: %v; want ErrBadArguments", id, err)
		}
		if _, err := a.Do(t.Context(), "cap-new", "capture_payment", withID, agent.DoOptions{}); !errors.Is(err, agent.ErrBadArguments) {
			t.Errorf("approval_id %q for a new action: %v; want ErrBadArguments", id, err)
		}
	}
	op, _ := a.Operation("cap")
	if _, ok := a.Operation("cap-new"); ok || len(op.Attempts) != 1 || len(op.Observations) != 0 || f.requests.Load() != 1 {
		t.Errorf("after the refusals: new action journaled %v, %d attempts, %d observations, %d requests; want none beyond the first",
			ok, len(op.Attempts), len(op.Observations), f.requests.Load())
	}
}

// A service's operation id that cannot travel in a header is not sent back as Supersedes-Operation-Id: the
// superseding action is refused before it is journaled, instead of failing every attempt as not_sent.
func TestServerIDThatCannotBeAHeaderIsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	f := newFakeService(t, answerJSON(http.StatusCreated, `{"id":"tkt_1","operation_id":"op_1\r\nX-Injected: 1"}`))
	a := f.open(t, filepath.Join(t.TempDir(), "supersedes.journal"), f.config("k"))
	if res, err := a.Do(t.Context(), "t1", "create_ticket", ticketArgs("first"), agent.DoOptions{}); err != nil || res.State != agent.StateSucceeded {
		t.Fatalf("Do = %+v, %v", res, err)
	}
	_, err := a.Do(t.Context(), "t2", "create_ticket", ticketArgs("second"), agent.DoOptions{Supersedes: "t1"})
	if _, ok := a.Operation("t2"); !errors.Is(err, agent.ErrBadArguments) || ok || f.requests.Load() != 1 {
		t.Errorf("superseding with an id no header can carry: %v, journaled %v, %d requests; want ErrBadArguments, nothing journaled or sent",
			err, ok, f.requests.Load())
	}
}

// Arguments larger than the agent sends are refused before anything is journaled or sent, with the limit in
// the error: not spent as five not_sent attempts and a needs_human.
func TestOversizedArgumentsAreRefusedBeforeAnything(t *testing.T) {
	t.Parallel()
	f := newFakeService(t, answerJSON(http.StatusCreated, `{"id":"tkt_1","operation_id":"op_1"}`))
	path := filepath.Join(t.TempDir(), "big.journal")
	a := f.open(t, path, f.config("k"))
	big := ticketArgs(strings.Repeat("x", 9<<20))
	_, err := a.Do(t.Context(), "big", "create_ticket", big, agent.DoOptions{})
	if !errors.Is(err, agent.ErrBadArguments) || !strings.Contains(err.Error(), "at most 1048576") {
		t.Errorf("9 MB of arguments: %v; want ErrBadArguments naming the limit", err)
	}
	if _, ok := a.Operation("big"); ok || f.requests.Load() != 0 {
		t.Errorf("journaled %v, %d requests; want neither", ok, f.requests.Load())
	}
	a.Close()
	if st, _ := os.Stat(path); st.Size() > 4096 {
		t.Errorf("the journal grew to %d bytes", st.Size())
	}

	cfg := f.config("k")
	cfg.MaxBodyBytes = 200
	small := f.open(t, filepath.Join(t.TempDir(), "small.journal"), cfg)
	if _, err := small.Do(t.Context(), "t", "create_ticket", ticketArgs(strings.Repeat("x", 300)), agent.DoOptions{}); !errors.Is(err, agent.ErrBadArguments) {
		t.Errorf("300 bytes over a 200-byte limit: %v; want ErrBadArguments", err)
	}
	if res, err := small.Do(t.Context(), "t", "create_ticket", ticketArgs("fits"), agent.DoOptions{}); err != nil || res.State != agent.StateSucceeded {
		t.Errorf("under the limit: %+v, %v; want it sent", res, err)
	}
}

// interrupt makes the ticket title under key and kills the agent once the answer is in, before it is
// journaled: the journal holds an operation that reached the service, with nothing to show where.
func (b *bundle) interrupt(t *testing.T, key, title string) {
	t.Helper()
	stop := errors.New("died")
	a, err := agent.Open(b.journal, agent.Config{TicketsURL: b.env.URL, APIKey: key,
		HTTPClient: &http.Client{Transport: b.fault}, Hook: func(p string) {
			if p == "after_answer" {
				panic(stop)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer func() {
		if r := recover(); r != stop {
			t.Fatalf("recovered %v", r)
		}
	}()
	_, _ = a.Do(context.Background(), "b", "create_ticket", ticketArgs(title), agent.DoOptions{})
}

func (b *bundle) ticketsIn(t *testing.T, account, title string) int {
	t.Helper()
	var n int
	if err := b.env.DB.Raw(`SELECT count(*) FROM tickets WHERE title = ? AND account_id = ?`, title, account).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// The operator's word that a key is of the journal's account (--same-account) is checked with the service
// before anything is sent: another account's key does not see the interrupted operation, and is refused
// rather than used to create the ticket a second time, in its own account. A rotated key of the same account
// sees it, and resumes it to the one ticket.
func TestSameAccountIsCheckedWithTheService(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	const first, rotated, other = "demo-account-first-key-secret", "demo-account-rotated-key-secret", "other-account-agent-key-secret"
	keys, err := auth.ParseKeys(servicetest.AccountDemo+":agent:"+first+","+servicetest.AccountDemo+":agent:"+rotated+
		","+servicetest.AccountOther+":agent:"+other, "a key id secret of thirty-two characters")
	if err != nil {
		t.Fatal(err)
	}
	env.Keys = keys
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, svc)
	b := &bundle{env: env, fault: &fault{next: http.DefaultTransport}, journal: filepath.Join(t.TempDir(), "agent.journal")}

	b.interrupt(t, other, "made in other")
	before := readFile(t, b.journal)
	cfg := agent.Config{TicketsURL: env.URL, APIKey: first, SameAccount: true,
		HTTPClient: &http.Client{Transport: b.fault}, BackoffBase: time.Millisecond}
	if a, err := agent.Open(b.journal, cfg); err == nil {
		_, _ = a.Resume(t.Context())
		a.Close()
		t.Error("Open with --same-account under another account's key succeeded")
	} else if !errors.Is(err, agent.ErrOtherPrincipal) {
		t.Errorf("Open with --same-account under another account's key = %v; want ErrOtherPrincipal", err)
	}
	if demo, other := b.ticketsIn(t, servicetest.AccountDemo, "made in other"), b.ticketsIn(t, servicetest.AccountOther, "made in other"); demo != 0 || other != 1 || b.fault.writes.Load() != 1 {
		t.Errorf("tickets: %d in the demo account, %d in the other, after %d writes; want 0, 1 and 1", demo, other, b.fault.writes.Load())
	}
	if after := readFile(t, b.journal); !bytes.Equal(after, before) {
		t.Errorf("the refused agent wrote %d bytes to the journal", len(after)-len(before))
	}

	b.journal = filepath.Join(t.TempDir(), "rotated.journal")
	b.interrupt(t, first, "made in demo")
	cfg.APIKey = rotated
	a, err := agent.Open(b.journal, cfg)
	if err != nil {
		t.Fatalf("Open with --same-account under a rotated key of the account = %v", err)
	}
	defer a.Close()
	results, err := a.Resume(t.Context())
	if err != nil || len(results) != 1 || results[0].State != agent.StateSucceeded {
		t.Fatalf("Resume under the rotated key = %+v, %v; want succeeded", results, err)
	}
	if demo, other := b.ticketsIn(t, servicetest.AccountDemo, "made in demo"), b.ticketsIn(t, servicetest.AccountOther, "made in demo"); demo != 1 || other != 0 {
		t.Errorf("tickets: %d in the demo account, %d in the other; want 1 and 0", demo, other)
	}
	if !bytes.Contains(readFile(t, b.journal), []byte(`"confirmed_by":["GET /v1/operations?idempotency_key=`)) {
		t.Error("the adoption does not record what confirmed the account")
	}
}

// An agent never leaves a journal empty (a new one appears with its first record), so an empty file is not
// taken for one: Open refuses it and leaves it, mode and all. A new journal is mode 0600, with nothing else left
// beside it; a journal others could read is made 0600, with a warning.
func TestJournalFileIsOnlyEverAJournalOfMode0600(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.journal")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(empty, 0o644); err != nil {
		t.Fatal(err)
	}
	if a, err := agent.Open(empty, agent.Config{Warn: func(string) {}}); !errors.Is(err, agent.ErrNotJournal) {
		if err == nil {
			a.Close()
		}
		t.Errorf("Open of an empty file = %v; want ErrNotJournal", err)
	}
	if st, err := os.Stat(empty); err != nil || st.Size() != 0 || st.Mode().Perm() != 0o644 {
		t.Errorf("the empty file after Open: %v, %v; want it left empty and 0644", st.Size(), st.Mode().Perm())
	}

	fresh := filepath.Join(dir, "new.journal")
	a, err := agent.Open(fresh, agent.Config{})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if st, err := os.Stat(fresh); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("a new journal's mode = %v, %v; want 0600", st.Mode().Perm(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("%d files in the directory; want the empty file and the journal only", len(entries))
	}

	if err := os.Chmod(fresh, 0o644); err != nil {
		t.Fatal(err)
	}
	var warnings []string
	a, err = agent.Open(fresh, agent.Config{Warn: func(msg string) { warnings = append(warnings, msg) }})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if st, err := os.Stat(fresh); err != nil || st.Mode().Perm() != 0o600 || len(warnings) != 1 || !strings.Contains(warnings[0], "mode 0644") ||
		!strings.Contains(warnings[0], "now mode 0600") {
		t.Errorf("a journal of mode 0644 after Open: %v, warnings %q; want 0600 and one warning", st.Mode().Perm(), warnings)
	}
}
