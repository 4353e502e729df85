package conformance

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
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
