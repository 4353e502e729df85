package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/proctest"
)

// A command tool from the shell: the real binary runs an effect on a local host under its own `retrysafe
// marker`, a second journal given the same action gets the marker's recorded result (the effect ran once), and
// the secret the command reads reaches neither the terminal, the journal nor show; audit verify --journal
// checks the command records.
func TestAgentCommandToolFromTheShell(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t)
	work, markers := t.TempDir(), filepath.Join(t.TempDir(), "markers")
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, fmt.Appendf(nil, `hosts:
  here: {local: true, marker_dir: %s, marker_helper: %s marker}
tools:
  - name: release
    kind: command
    summary: Record a release with the release token.
    host: here
    family: effect
    workdir: %s
    secrets: [RELEASE_TOKEN]
    command: printf '%%s %%s\n' {{version}} "$RELEASE_TOKEN" >> releases.txt && echo released {{version}} with "$RELEASE_TOKEN"
    input_schema: {type: object, required: [version], properties: {version: {type: string}}}
`, markers, bin, work), 0o600); err != nil {
		t.Fatal(err)
	}
	const secret = "rel-tok-93a1f0"
	w := &agentWorld{bin: bin, env: map[string]string{"RELEASE_TOKEN": secret}}
	journals := []string{filepath.Join(t.TempDir(), "a.jsonl"), filepath.Join(t.TempDir(), "b.jsonl")}
	var seen []string
	for i, j := range journals {
		res := w.runAgent(t, nil, "agent", "do", "--journal", j, "--tools", tools, "--action", "release-7", "release", `{"version":"7.0"}`)
		if res.code != 0 {
			t.Fatalf("journal %d: exit %d\n%s%s", i, res.code, res.stdout, res.stderr)
		}
		r := res.result(t)
		if r.State != "succeeded" || !strings.Contains(string(r.Body), "released 7.0 with [secret RELEASE_TOKEN]") {
			t.Fatalf("journal %d: %+v", i, r)
		}
		if replayed := strings.Contains(string(r.Body), `"replayed":true`); replayed != (i == 1) {
			t.Fatalf("journal %d: body %s, want replayed only for the second journal", i, r.Body)
		}
		show := w.runAgent(t, nil, "agent", "show", "--journal", j, "release-7")
		verify := w.runAgent(t, nil, "audit", "verify", "--journal", j)
		if verify.code != 0 || !strings.Contains(verify.stdout, "INTACT") {
			t.Fatalf("audit verify --journal: exit %d\n%s%s", verify.code, verify.stdout, verify.stderr)
		}
		raw, _ := os.ReadFile(j)
		seen = append(seen, res.stdout, res.stderr, show.stdout, show.stderr, string(raw))
		if !strings.Contains(show.stdout, "marker      here:"+markers+"/") || !strings.Contains(show.stdout, "boundary exit_received exit 0") {
			t.Fatalf("show:\n%s", show.stdout)
		}
	}
	for _, s := range seen {
		if strings.Contains(s, secret) {
			t.Fatalf("the secret reached the terminal or a journal:\n%s", s)
		}
	}
	raw, _ := os.ReadFile(filepath.Join(work, "releases.txt"))
	if n := bytes.Count(raw, []byte("\n")); n != 1 || !strings.Contains(string(raw), secret) {
		t.Fatalf("releases.txt %q: want one release, with the token", raw)
	}
}
