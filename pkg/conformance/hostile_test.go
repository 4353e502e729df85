package conformance

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// hostileTarget answers setup (POST /setup) with a value of its choosing as "id", records every other request,
// and serves the rest with write (a correct retry-safe write by default) and GET /count.
type hostileTarget struct {
	saved string
	write http.Handler
	mem   *memoryTarget

	mu       sync.Mutex
	uris     []string // request URIs of the writes and counts
	refs     []string // X-Ref header values of the writes
	counts   []string // the x query value of each count
	requests int
}

func newHostileTarget(t *testing.T, saved string) (*hostileTarget, *httptest.Server) {
	t.Helper()
	h := &hostileTarget{saved: saved, mem: &memoryTarget{stored: map[string]memoryAnswer{}}}
	h.write = h.mem
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return h, srv
}

func (h *hostileTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.requests++
	if r.URL.Path != "/setup" {
		h.uris = append(h.uris, r.RequestURI)
	}
	if r.Method == http.MethodGet {
		h.counts = append(h.counts, r.URL.Query()["x"]...)
	} else if r.URL.Path != "/setup" {
		h.refs = append(h.refs, r.Header.Get("X-Ref"))
	}
	h.mu.Unlock()
	if r.URL.Path == "/setup" {
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]string{"id": h.saved})
		return
	}
	if r.Method == http.MethodGet {
		h.mem.ServeHTTP(w, r)
		return
	}
	h.write.ServeHTTP(w, r)
}

func (h *hostileTarget) seen() (requests int, uris, refs, counts []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.requests, slices.Clone(h.uris), slices.Clone(h.refs), slices.Clone(h.counts)
}

// shellInjection is a value that runs `touch` in dir from every shell quoting context a splice could land in:
// bare, inside double quotes, after closing single quotes, and in backquotes.
func shellInjection(dir string) string {
	return fmt.Sprintf("$(touch %[1]s/bare)\"$(touch %[1]s/dq)\"'$(touch %[1]s/sq)'`touch %[1]s/bq`", dir)
}

func assertNoMarker(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("a value from the target ran as shell: %s was created", e.Name())
	}
}

const hostileSetup = `"setup":[{"method":"POST","path":"/setup","save":{"id":"id"}}]`

// TestCountCommandIsNeverFilled: a {{name}} in the count command is refused before anything is sent, so a value
// the target saved can never become shell text (before, it was spliced in with single quotes, which do not hold
// inside the double quotes the command put around it, and `$(touch ...)` ran).
func TestCountCommandIsNeverFilled(t *testing.T) {
	t.Parallel()
	marks := t.TempDir()
	h, srv := newHostileTarget(t, shellInjection(marks))
	for _, command := range []string{
		`echo "{{id}}" >/dev/null; echo 0`,
		`echo {{id}} >/dev/null; echo 0`,
		`psql -tAc "SELECT count(*) FROM t WHERE id = '{{id}}'" || echo 0`,
	} {
		spec := Spec{
			Method: "POST", Path: "/w", Body: json.RawMessage(`{"a":1}`), Variant: json.RawMessage(`{"a":2}`),
			Setup: []Step{{Method: "POST", Path: "/setup", Save: map[string]string{"id": "id"}}},
			Count: Count{Command: command},
		}
		_, err := Run(context.Background(), spec, Options{Target: srv.URL, Cases: []int{CaseMissingKeys}})
		if err == nil || !strings.Contains(err.Error(), `"$CONFORMANCE_ID"`) {
			t.Errorf("Run with count command %q = %v; want it refused, naming $CONFORMANCE_ID", command, err)
		}
		if _, err := ParseSpec([]byte(`{"method":"POST","path":"/w","body":{"a":1},"variant":{"a":2},` + hostileSetup +
			`,"count":{"command":` + mustJSON(t, command) + `}}`)); err == nil {
			t.Errorf("ParseSpec accepted count command %q", command)
		}
	}
	assertNoMarker(t, marks)
	if n, _, _, _ := h.seen(); n != 0 {
		t.Errorf("the target got %d requests from a refused request file", n)
	}
}

// TestCountCommandReadsValuesFromItsEnvironment: the count command gets the saved value byte for byte as
// CONFORMANCE_ID, and nothing in it runs.
func TestCountCommandReadsValuesFromItsEnvironment(t *testing.T) {
	t.Parallel()
	marks := t.TempDir()
	value := shellInjection(marks)
	_, srv := newHostileTarget(t, value)
	got := filepath.Join(t.TempDir(), "got")
	spec, err := ParseSpec([]byte(`{"method":"POST","path":"/w","body":{"a":1},"variant":{"a":2},` + hostileSetup +
		`,"count":{"command":"printf '%s' \"$CONFORMANCE_ID\" > \"$GOT\"; echo 0"}}`))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), spec, Options{Target: srv.URL, Cases: []int{CaseMissingKeys}, Env: []string{"GOT=" + got}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Verdicts()[CaseMissingKeys] != Pass {
		t.Errorf("case 6: %v %v; want pass", rep.Verdicts(), rep.Results[0].Evidence)
	}
	data, err := os.ReadFile(got)
	if err != nil || string(data) != value {
		t.Errorf("the command read CONFORMANCE_ID = %q, %v; want %q", data, err, value)
	}
	assertNoMarker(t, marks)
}

// TestSavedValuesStayData: a saved value is sent as the data it is wherever the file places it: in a header it is
// not read as a ${NAME} reference (which would send the target any environment variable it names), neither by
// this process nor by case 3's new caller reading its state file; in a path it is one segment, escaped once, and
// in a count query one value.
func TestSavedValuesStayData(t *testing.T) {
	t.Parallel()
	const value = "${HIDDEN} a/b?c&d=e#f%"
	h, srv := newHostileTarget(t, value)
	spec, err := ParseSpec([]byte(`{"method":"POST","path":"/w/{{id}}",
		"headers":{"Authorization":"Bearer ${TOKEN}","X-Ref":"{{id}}"},"body":{"a":1},"variant":{"a":2},` + hostileSetup +
		`,"count":{"url":"/count?x={{id}}","field":"effects"}}`))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TOKEN": "tok-secret", "HIDDEN": "do-not-send"}
	rep, err := Run(context.Background(), spec, Options{
		Target: srv.URL, Getenv: func(name string) string { return env[name] }, Copies: 5,
		Cases: []int{CaseLostResponse, CaseRestartedCaller, CaseMissingKeys},
	})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.WriteTable(&out)
	t.Logf("\n%s", out.String())
	if !rep.Passed() {
		t.Errorf("verdicts %v; want every case passed", rep.Verdicts())
	}
	_, uris, refs, counts := h.seen()
	wantWrite := "/w/$%7BHIDDEN%7D%20a%2Fb%3Fc&d=e%23f%25"
	writes := 0
	for _, u := range uris {
		if strings.HasPrefix(u, "/count") {
			continue
		}
		writes++
		if u != wantWrite {
			t.Errorf("write sent to %s; want %s", u, wantWrite)
		}
	}
	if writes < 3+4 { // case 1 (dropped, retried), case 3 (dropped, retried by the new caller), case 6's four
		t.Errorf("%d writes; want at least 7", writes)
	}
	for _, ref := range refs {
		if ref != value {
			t.Errorf("X-Ref sent as %q; want the saved value %q as it is", ref, value)
		}
	}
	if len(counts) == 0 {
		t.Error("no count reached the target")
	}
	for _, c := range counts {
		if c != value {
			t.Errorf("count query x = %q; want %q", c, value)
		}
	}
}

// problemWith answers every write 400 with code as its problem code.
func problemWith(code string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"code": code})
	})
}

// terminalControl is a string a hostile target sends to take over a terminal: OSC to set the title and write the
// clipboard, BEL, CSI to clear the screen (in 7 and 8 bits), a bidirectional override, a byte that is not UTF-8.
const terminalControl = "\x1b]0;owned\a\x1b]52;c;cm0gLXJmIH4=\a\x1b[2J\u009b2J\u202eevil\xff"

// forbidden reports the first rune in s a terminal could act on (newlines end the table's lines and are kept).
func forbidden(s string) (rune, bool) {
	for i, c := range s {
		if c == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD") {
			return c, true
		}
		if c < 0x20 && c != '\n' || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == '\u202e' {
			return c, true
		}
	}
	return 0, false
}

// TestTargetTextIsEscaped: what the target answers (a problem code, a saved value the count command writes to its
// error output) reaches the table and the JUnit report escaped: no raw control character, the escapes visible.
func TestTargetTextIsEscaped(t *testing.T) {
	t.Parallel()
	var printed strings.Builder
	// The target's problem code, in case 1 (the write refused) and case 6 (each key answer described).
	h, srv := newHostileTarget(t, "x")
	h.write = problemWith(terminalControl)
	spec, err := ParseSpec([]byte(`{"method":"POST","path":"/w","body":{"a":1},"variant":{"a":2},
		"count":{"url":"/count","field":"effects"}}`))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), spec, Options{Target: srv.URL, Cases: []int{CaseLostResponse, CaseMissingKeys}})
	if err != nil {
		t.Fatal(err)
	}
	rep.WriteTable(&printed)
	rep.WriteJUnit(&printed)
	// A saved value (JSON carries no invalid UTF-8: the command adds a byte of it), through the count command's
	// error output.
	_, srv2 := newHostileTarget(t, terminalControl)
	spec, err = ParseSpec([]byte(`{"method":"POST","path":"/w","body":{"a":1},"variant":{"a":2},` + hostileSetup +
		`,"count":{"command":"printf '%s\\377' \"$CONFORMANCE_ID\" >&2; exit 1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	rep, err = Run(context.Background(), spec, Options{Target: srv2.URL, Cases: []int{CaseMissingKeys}})
	if err != nil {
		t.Fatal(err)
	}
	rep.WriteTable(&printed)
	rep.WriteJUnit(&printed)

	out := printed.String()
	t.Logf("\n%s", out)
	if c, found := forbidden(out); found {
		t.Errorf("the report carries %U raw", c)
	}
	for _, want := range []string{`\x1b]0;owned\a`, `\u009b2J`, `\u202eevil`, "\uFFFD\\xff"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report does not show %s", want)
		}
	}
}

// TestShortSecretsAreMasked: a secret of any length is masked, including one shorter than four characters, and a
// secret that holds another is masked whole.
func TestShortSecretsAreMasked(t *testing.T) {
	t.Parallel()
	h, srv := newHostileTarget(t, "x")
	h.write = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { // echoes the credentials it got
		problemWith(r.Header.Get("X-A")+" "+r.Header.Get("X-B")).ServeHTTP(w, r)
	})
	spec, err := ParseSpec([]byte(`{"method":"POST","path":"/w","headers":{"X-A":"${A}","X-B":"${B}"},
		"body":{"a":1},"variant":{"a":2},"count":{"url":"/count","field":"effects"}}`))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"A": "Zq", "B": "Zq7-longer"}
	rep, err := Run(context.Background(), spec, Options{
		Target: srv.URL, Getenv: func(name string) string { return env[name] }, Cases: []int{CaseMissingKeys},
	})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.WriteTable(&out)
	rep.WriteJUnit(&out)
	t.Logf("\n%s", out.String())
	for _, leak := range []string{"Zq", "7-longer"} {
		if strings.Contains(out.String(), leak) {
			t.Errorf("the report shows %q", leak)
		}
	}
	if !strings.Contains(out.String(), "400 *** ***") {
		t.Error("the echoed secrets are not shown masked")
	}
}

func TestEscapeControls(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain text, ünïcode and 日本":  "plain text, ünïcode and 日本",
		"\x1b[31mred\x1b[0m":          `\x1b[31mred\x1b[0m`,
		"bell\a tab\t line\n cr\r":    `bell\a tab\t line\n cr\r`,
		"csi\u009b nel\u0085 del\x7f": `csi\u009b nel\u0085 del\x7f`,
		"rlo\u202e zw\u200b":          `rlo\u202e zw\u200b`,
		"bad\xff\xfe":                 `bad\xff\xfe`,
	} {
		if got := escapeControls(in); got != want {
			t.Errorf("escapeControls(%q) = %s; want %s", in, got, want)
		}
	}
}

// A target that echoes the credential it got in another form (upper- or lower-case, base64 in either alphabet
// with or without padding, hex in either case) has it masked in each: the report shows none of them, and the
// text around them is kept.
func TestSecretIsMaskedInEveryForm(t *testing.T) {
	t.Parallel()
	const secret = "Tok>>?~en-5ecret!"
	b := []byte(secret)
	forms := []string{secret, strings.ToUpper(secret), strings.ToLower(secret),
		base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
		base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
		hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b))}
	spec, err := ParseSpec([]byte(`{"method":"POST","path":"/w","headers":{"Authorization":"Bearer ${TOKEN}"},
		"body":{"a":1},"variant":{"a":2},"count":{"url":"/count","field":"effects"}}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRunner(spec, Options{Target: "http://127.0.0.1:1", Getenv: func(string) string { return secret }})
	if err != nil {
		t.Fatal(err)
	}
	masked := r.mask("echoed: " + strings.Join(forms, ", ") + ".")
	for _, form := range forms {
		if strings.Contains(masked, form) {
			t.Errorf("the masked text shows the secret as %q: %s", form, masked)
		}
	}
	if want := "echoed: " + strings.TrimSuffix(strings.Repeat("***, ", len(forms)), ", ") + "."; masked != want {
		t.Errorf("masked text %q; want %q", masked, want)
	}
}
