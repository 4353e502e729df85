package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestReorderJSONIsTheSameValueInOtherBytes(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"a":1,"b":{"c":[1,2,{"d":"x<y","e":null}],"f":true},"g":12.50}`,
		`{"only":"one"}`,
		`[{"a":1,"b":2}]`,
		`{}`,
		`"text"`,
	} {
		out, err := reorderJSON([]byte(in))
		if err != nil {
			t.Fatalf("reorderJSON(%s): %v", in, err)
		}
		if string(out) == in || !json.Valid(out) || !jsonEqual(out, []byte(in)) {
			t.Errorf("reorderJSON(%s) = %s; want other bytes, the same value", in, out)
		}
	}
	out, _ := reorderJSON([]byte(`{"a":1,"b":2}`))
	if strings.Index(string(out), `"b"`) > strings.Index(string(out), `"a"`) {
		t.Errorf("members not reordered: %s", out)
	}
	if !strings.Contains(string(mustReorder(t, `{"amount":12.50}`)), "12.50") {
		t.Error("a number was rewritten")
	}
}

func mustReorder(t *testing.T, s string) []byte {
	t.Helper()
	out, err := reorderJSON([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestParseSpecRefuses(t *testing.T) {
	t.Parallel()
	const base = `"method":"POST","path":"/x","body":{"a":1},"variant":{"a":2},"count":{"command":"echo 0"}`
	for _, tc := range []struct{ spec, want string }{
		{`{` + base + `,"extra":1}`, "unknown field"},
		{`{"method":"GET","path":"/x","body":{},"variant":{"a":1}}`, "a write"},
		{`{"method":"POST","path":"/x","body":{"a":1},"variant":{"a":1}}`, "differ"},
		{`{` + base + `,"headers":{"authorization":"Bearer abc"}}`, "environment"},
		{`{` + base + `,"headers":{"Cookie":"s=1"}}`, "environment"},
		{`{` + base + `,"copies":100000}`, "copies"},
		{`{"method":"POST","path":"/x","body":{"a":1},"variant":{"a":2},"count":{"url":"/n"}}`, "length"},
		{`{` + base + `,"setup":[{"method":"POST","path":"/s","save":{"a-b":"id"}}]}`, "save"},
		{`{"method":"POST","path":"/x","body":{"a":1},"variant":{"a":2},"count":{"command":"echo {{unique}}"}}`, "CONFORMANCE_UNIQUE"},
	} {
		if _, err := ParseSpec([]byte(tc.spec)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSpec(%s) = %v; want an error mentioning %q", tc.spec, err, tc.want)
		}
	}
	s, err := ParseSpec([]byte(`{` + base + `,"headers":{"Authorization":"Bearer ${TOKEN}"}}`))
	if err != nil || s.Copies != defaultCopies || s.KeyHeader != "Idempotency-Key" || s.Name != "POST /x" {
		t.Errorf("ParseSpec = %+v, %v; want defaults", s, err)
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()
	body := []byte(`{"items":[{"id":"a"},{"id":"b"}],"stats":{"total":7}}`)
	for path, want := range map[string]string{"items.1.id": "b", "stats.total": "7"} {
		v, err := lookup(body, path)
		if err != nil {
			t.Fatalf("lookup %s: %v", path, err)
		}
		if got := strings.Trim(mustJSON(t, v), `"`); got != want {
			t.Errorf("lookup %s = %s; want %s", path, got, want)
		}
	}
	for _, path := range []string{"items.2", "stats.none", "items.x"} {
		if _, err := lookup(body, path); err == nil {
			t.Errorf("lookup %s found something", path)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestOnlyTheNamedAddresses: a target that redirects a write elsewhere does not get the run to follow; the other
// address never sees a request. The count command's number and the secret masking are checked on the way.
func TestOnlyTheNamedAddresses(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(other.Close)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret-value" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		http.Redirect(w, r, other.URL+"/steal?token=s3cret-value", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(target.Close)
	spec, err := ParseSpec([]byte(`{"method":"POST","path":"/x","headers":{"Authorization":"Bearer ${TOKEN}"},
		"body":{"a":1},"variant":{"a":2},"count":{"command":"echo 3"}}`))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), spec, Options{
		Target: target.URL, Getenv: func(string) string { return "s3cret-value" }, Copies: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if elsewhere.Load() != 0 {
		t.Errorf("the other address got %d requests", elsewhere.Load())
	}
	if strings.Contains(out.String(), "s3cret-value") {
		t.Errorf("the table shows the secret:\n%s", out.String())
	}
	if rep.Passed() || rep.Verdicts()[CaseKilledWorker] != NotChecked {
		t.Errorf("verdicts %v; want failures and case 7 not checked\n%s", rep.Verdicts(), out.String())
	}
	t.Logf("\n%s", out.String())
	if !strings.Contains(out.String(), "effect 3 -> 3") {
		t.Errorf("the count command's number is not in the table:\n%s", out.String())
	}
}

// memoryTarget is a correct retry-safe write kept in memory: a claim per key, the stored answer replayed, a
// changed request refused. It lets the cases run without a database.
type memoryTarget struct {
	mu      sync.Mutex
	stored  map[string]memoryAnswer
	effects atomic.Int64
}

type memoryAnswer struct {
	request string
	body    []byte
}

func (m *memoryTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		fmt.Fprintf(w, `{"effects":%d}`, m.effects.Load())
		return
	}
	key, ok := r.Header["Idempotency-Key"]
	if !ok || key[0] == "" || len(key[0]) > 255 || strings.ContainsFunc(key[0], func(c rune) bool { return c < 0x20 || c > 0x7e }) {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var v any
	if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	canonical, _ := json.Marshal(v)
	m.mu.Lock()
	defer m.mu.Unlock()
	if a, ok := m.stored[key[0]]; ok {
		if a.request != string(canonical) {
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"code":"idempotency_key_reused"}`)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		w.Write(a.body)
		return
	}
	n := m.effects.Add(1)
	body := []byte(fmt.Sprintf(`{"id":"res_%04d"}`, n))
	m.stored[key[0]] = memoryAnswer{string(canonical), body}
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}

// TestKillHookCommand: case 7 runs the file's kill_hook with sh; a hook that kills nothing (the request in flight
// is answered) leaves the case not checked, and a hook that fails makes it an error; neither is a pass. The state file of case 3 keeps ${NAME}, not the secret.
func TestKillHookCommand(t *testing.T) {
	t.Parallel()
	target := httptest.NewServer(&memoryTarget{stored: map[string]memoryAnswer{}})
	t.Cleanup(target.Close)
	for _, tc := range []struct {
		hook string
		want Verdict
	}{
		{`test "$MARK" = on`, NotChecked}, // runs with Options.Env, but kills nothing: never a pass
		{`echo broken >&2; exit 3`, Error},
	} {
		spec, err := ParseSpec([]byte(`{"method":"POST","path":"/w","headers":{"Authorization":"Bearer ${TOKEN}"},
			"body":{"a":1,"b":[1,2]},"variant":{"a":2,"b":[1,2]},"count":{"url":"/count","field":"effects"},
			"kill_hook":` + mustJSON(t, tc.hook) + `}`))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Run(context.Background(), spec, Options{
			Target: target.URL, Getenv: func(string) string { return "tok-secret" }, Copies: 10, Env: []string{"MARK=on"},
		})
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		rep.WriteTable(&out)
		t.Logf("\n%s", out.String())
		for n, v := range rep.Verdicts() {
			want := Pass
			if n == CaseKilledWorker {
				want = tc.want
			}
			if v != want {
				t.Errorf("hook %q: case %d %s; want %s", tc.hook, n, v, want)
			}
		}
	}
}

func TestStateFileKeepsNoSecret(t *testing.T) {
	t.Parallel()
	spec, err := ParseSpec([]byte(`{"method":"POST","path":"/w/{{unique}}","headers":{"Authorization":"Bearer ${TOKEN}"},
		"body":{"a":1},"variant":{"a":2},"count":{"command":"echo 0"}}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRunner(spec, Options{Target: "http://127.0.0.1:1", Getenv: func(string) string { return "tok-secret" }})
	if err != nil {
		t.Fatal(err)
	}
	c := &caseRun{n: CaseRestartedCaller, vars: map[string]string{"unique": "u-3"}}
	file, cleanup, err := r.saveState(c, "key-1", []byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "tok-secret") || !strings.Contains(string(data), "${TOKEN}") || !strings.Contains(string(data), "/w/u-3") {
		t.Errorf("state file: %s", data)
	}
}
