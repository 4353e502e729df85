package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/pkg/agent"
)

// TestToolsFlag: `retrysafe mcp --tools FILE` lists that file's tools (and the agent's own two), not the demo
// services'; a tools file that cannot be used is a usage error before anything is opened.
func TestToolsFlag(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t)
	journal := t.TempDir() + "/tools.journal"
	mcp := exec.Command(bin, "mcp", "--journal", journal, "--tools", "../../examples/tools/notes.yaml")
	mcp.Env = []string{"AGENT_API_KEY=k", "NOTES_URL=http://127.0.0.1:1"}
	mcp.Stdin = strings.NewReader(strings.Join(append(mcpInitialize, rpc(2, "tools/list", nil)), "\n") + "\n")
	var out, stderr bytes.Buffer
	mcp.Stdout, mcp.Stderr = &out, &stderr
	if err := mcp.Run(); err != nil {
		t.Fatalf("mcp --tools: %v\n%s", err, stderr.String())
	}
	list := out.String()
	for _, name := range []string{`"create_note"`, `"get_operation"`, `"retry_action"`} {
		if !strings.Contains(list, name) {
			t.Errorf("tools/list has no %s: %.500s", name, list)
		}
	}
	if strings.Contains(list, `"create_ticket"`) {
		t.Errorf("tools/list offers the demo tools with a tools file: %.500s", list)
	}

	// A hostile tools file is refused with a clear error, not read until memory runs out.
	bomb := t.TempDir() + "/bomb.yaml"
	if err := os.WriteFile(bomb, []byte(`a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
tools: *i
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"/dev/zero": "not a regular file", bomb: "its aliases make more than"} {
		cmd := exec.Command(bin, "mcp", "--journal", journal, "--tools", file)
		cmd.Env = []string{"AGENT_API_KEY=k"}
		output, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(output), want) {
			t.Errorf("mcp --tools %s: %v %s; want exit 1 saying %q", file, err, output, want)
		}
	}

	for _, args := range [][]string{
		{"mcp", "--journal", journal, "--tools", "no-such-file.yaml"},
		{"agent", "do", "--journal", journal, "--tools", "../../examples/tools/notes.yaml", "--action", "a", "create_ticket", `{}`},
		{"agent", "do", "--journal", journal, "--tools", "../../pkg/agent/doc.go", "--action", "a", "create_note", `{}`},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"AGENT_API_KEY=k"}
		output, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(output), "tool") {
			t.Errorf("%v: %v %s; want exit 1 naming the tools", args, err, output)
		}
	}
}

// TestEveryAgentSubcommandTakesTools: do, resume, retry and mcp take --tools, so show and resolve take it too
// (one command line for a journal serves them all); a tools file that cannot be read is refused by each.
func TestEveryAgentSubcommandTakesTools(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t)
	journal := t.TempDir() + "/show.journal"
	a, err := agent.Open(journal, agent.Config{APIKey: "k", Tools: agent.DemoTools()})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	show := exec.Command(bin, "agent", "show", "--journal", journal, "--tools", "../../examples/tools/notes.yaml")
	show.Env = []string{"AGENT_API_KEY=k"}
	if out, err := show.CombinedOutput(); err != nil {
		t.Errorf("agent show --tools: %v\n%s", err, out)
	}
	for _, sub := range [][]string{{"show"}, {"resolve", "--state", "failed", "--evidence", "e", "x"}} {
		args := append([]string{"agent", sub[0], "--journal", journal, "--tools", "no-such-file.yaml"}, sub[1:]...)
		cmd := exec.Command(bin, args...)
		output, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(output), "--tools") {
			t.Errorf("%v: %v %s; want exit 1 naming --tools", args, err, output)
		}
	}
}
