package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"strings"
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
