package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// TestConformanceCommand runs `retrysafe conformance` through run against tickets served in-process: once as
// the request file says (exit 0, JUnit with case 7 skipped), once with a replay marker tickets does not send
// (case 1 fails: exit 1, a JUnit failure). Case 3's new caller is the built binary. No DATABASE_URL is given.
func TestConformanceCommand(t *testing.T) {
	bin := proctest.Build(t)
	saved := restartCommand
	restartCommand = func() ([]string, error) { return []string{bin, "conformance", "--resume"}, nil }
	t.Cleanup(func() { restartCommand = saved })

	svc := servicetest.New(t)
	ticketsSvc, err := tickets.New(svc.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Serve(t, ticketsSvc)
	vars := env(map[string]string{"RETRYSAFE_TOKEN": servicetest.AgentSecret})
	dir := t.TempDir()

	var out bytes.Buffer
	report := filepath.Join(dir, "report.xml")
	err = run(context.Background(), []string{"conformance", "--target", svc.URL,
		"--request", "../../examples/conformance/tickets.json", "--report", report, "--copies", "20"}, vars, &out)
	if err != nil {
		t.Fatalf("conformance against tickets: %v\n%s", err, out.String())
	}
	t.Logf("\n%s", out.String())
	if !strings.Contains(out.String(), "PASS: 6 passed, 0 failed, 1 not checked") ||
		!strings.Contains(out.String(), "new process `retrysafe conformance --resume`") {
		t.Errorf("table:\n%s", out.String())
	}
	suite := readJUnit(t, report)
	if suite.Tests != 7 || suite.Failures != 0 || suite.Errors != 0 || suite.Skipped != 1 {
		t.Errorf("JUnit: %+v; want 7 tests, 1 skipped", suite)
	}

	spec, err := os.ReadFile("../../examples/conformance/tickets.json")
	if err != nil {
		t.Fatal(err)
	}
	marked := filepath.Join(dir, "marked.json")
	changed := strings.Replace(string(spec), `"method"`, `"replay_marker": "X-Replayed: yes", "method"`, 1)
	if err := os.WriteFile(marked, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = run(context.Background(), []string{"conformance", "--target", svc.URL, "--request", marked,
		"--report", report, "--cases", "1,6"}, vars, &out)
	if !errors.Is(err, errConformanceFailed) || exitCode(err) != 1 {
		t.Fatalf("conformance with a marker tickets does not send = %v; want errConformanceFailed, exit 1\n%s", err, out.String())
	}
	suite = readJUnit(t, report)
	if suite.Tests != 2 || suite.Failures != 1 || suite.Cases[0].Failure == nil ||
		!strings.Contains(suite.Cases[0].Failure.Message, "not marked as a replay") {
		t.Errorf("JUnit: %+v; want case 1 failed for the marker", suite)
	}
	if strings.Contains(out.String(), servicetest.AgentSecret) {
		t.Error("the table shows the secret")
	}
}

func readJUnit(t *testing.T, path string) junitSuite {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(servicetest.AgentSecret)) {
		t.Error("the JUnit report shows the secret")
	}
	var doc struct {
		Suites []junitSuite `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil || len(doc.Suites) != 1 {
		t.Fatalf("JUnit report: %v\n%s", err, data)
	}
	return doc.Suites[0]
}

type junitSuite struct {
	Tests    int `xml:"tests,attr"`
	Failures int `xml:"failures,attr"`
	Errors   int `xml:"errors,attr"`
	Skipped  int `xml:"skipped,attr"`
	Cases    []struct {
		Name    string `xml:"name,attr"`
		Failure *struct {
			Message string `xml:"message,attr"`
		} `xml:"failure"`
	} `xml:"testcase"`
}

// TestConformanceRefuses: bad invocations and request files that would contact an unnamed address or carry a
// secret are refused before anything is sent, with exit code 2; no configuration is needed (no DATABASE_URL).
func TestConformanceRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const write1 = `"method":"POST","path":"/v1/orders","body":{"a":1},"variant":{"a":2}`
	elsewhere := write("elsewhere.json", `{`+write1+`,"count":{"url":"http://192.0.2.1:9/count","field":"n"}}`)
	literal := write("literal.json", `{`+write1+`,"headers":{"Authorization":"Bearer sk_live_123"},"count":{"command":"echo 0"}}`)
	unset := write("unset.json", `{`+write1+`,"headers":{"Authorization":"Bearer ${NOT_SET}"},"count":{"command":"echo 0"}}`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"conformance"}, "usage"},
		{[]string{"conformance", "--target", "ftp://x", "--request", unset}, "target"},
		{[]string{"conformance", "--target", "http://127.0.0.1:1", "--request", elsewhere}, "--allow 192.0.2.1:9"},
		{[]string{"conformance", "--target", "http://127.0.0.1:1", "--request", literal}, "from the environment"},
		{[]string{"conformance", "--target", "http://127.0.0.1:1", "--request", unset}, "NOT_SET"},
		{[]string{"conformance", "--target", "http://127.0.0.1:1", "--request", unset, "--cases", "9"}, "case"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), tc.args, env(nil), &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) || exitCode(err) != 2 {
			t.Errorf("run(%v) = %v; want an error mentioning %q, exit 2", tc.args, err, tc.want)
			continue
		}
		if strings.Contains(err.Error()+out.String(), "sk_live_123") {
			t.Errorf("run(%v) printed the secret", tc.args)
		}
	}
}

// TestConformanceHostileTarget: `retrysafe conformance` against a target that answers with shell in the value a
// setup step saves and terminal escapes in its problem codes, echoing the (short) secret it was sent. A count
// command that would splice the saved value is refused (exit 2, nothing sent); one that reads it from its
// environment runs it as data. Nothing the target sent runs, no raw control character reaches stdout or the JUnit
// report, and the secret is masked.
func TestConformanceHostileTarget(t *testing.T) {
	t.Parallel()
	marks := t.TempDir()
	var requests atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		switch {
		case r.URL.Path == "/setup":
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(map[string]string{"id": fmt.Sprintf("$(touch %[1]s/a)\"$(touch %[1]s/b)\"'`touch %[1]s/c`'", marks)})
		default:
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"code": "\x1b]0;owned\a\x1b[2J\u009b0m " + r.Header.Get("Authorization")})
		}
	}))
	t.Cleanup(target.Close)
	dir := t.TempDir()
	write := func(name, command string) string {
		p := filepath.Join(dir, name)
		quoted, err := json.Marshal(command)
		if err != nil {
			t.Fatal(err)
		}
		spec := `{"method":"POST","path":"/w","headers":{"Authorization":"Bearer ${TOKEN}"},"body":{"a":1},"variant":{"a":2},
			"setup":[{"method":"POST","path":"/setup","save":{"id":"id"}}],"count":{"command":` + string(quoted) + `}}`
		if err := os.WriteFile(p, []byte(spec), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	vars := env(map[string]string{"TOKEN": "k1"})

	spliced := write("spliced.json", `echo "{{id}}" >/dev/null; echo 0`)
	var out bytes.Buffer
	err := run(context.Background(), []string{"conformance", "--target", target.URL, "--request", spliced}, vars, &out)
	if exitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), "$CONFORMANCE_ID") {
		t.Errorf("a count command with {{id}} = %v (exit %d); want refused, exit 2, naming $CONFORMANCE_ID", err, exitCode(err))
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("the target got %d requests from a refused request file", n)
	}

	fromEnv := write("env.json", `test -n "$CONFORMANCE_ID" && echo 0`)
	report := filepath.Join(dir, "report.xml")
	out.Reset()
	err = run(context.Background(), []string{"conformance", "--target", target.URL, "--request", fromEnv,
		"--report", report, "--cases", "6"}, vars, &out)
	if err != nil {
		t.Fatalf("conformance = %v; want case 6 passed\n%s", err, out.String())
	}
	junit, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s\n%s", out.String(), junit)
	for name, printed := range map[string]string{"stdout": out.String(), "the JUnit report": string(junit)} {
		if i := strings.IndexFunc(printed, func(c rune) bool { return c == 0x1b || c == '\a' || c == 0x9b }); i >= 0 {
			t.Errorf("%s carries %U raw", name, []rune(printed[i:])[0])
		}
		if !strings.Contains(printed, `400 \x1b]0;owned\a\x1b[2J\u009b0m Bearer ***`) {
			t.Errorf("%s does not show the target's code escaped and its secret masked", name)
		}
		if strings.Contains(printed, "k1") {
			t.Errorf("%s shows the secret", name)
		}
	}
	if entries, _ := os.ReadDir(marks); len(entries) > 0 {
		t.Errorf("a value from the target ran as shell: %d marker file(s)", len(entries))
	}
}
