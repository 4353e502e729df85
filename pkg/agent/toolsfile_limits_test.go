package agent_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// allocated is how many bytes f allocates. The tests that use it are not parallel: no other test allocates
// meanwhile.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// toolsAllocBound is far above what refusing any of these files takes, and far below what reading them whole
// would (gigabytes).
const toolsAllocBound = 64 << 20

// aliasBomb is ten lines that name the line before nine times: 9^9 (387 million) strings.
const aliasBomb = `a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
tools: *i
`

// TestToolsFileLimits: a tools file that would make a huge value from a few bytes (aliases), nest 200,000
// deep, or exceed the size limit is refused at once, saying which limit, with bounded memory.
func TestToolsFileLimits(t *testing.T) {
	const deep = 200_000
	for _, tc := range []struct{ name, file, want string }{
		{"an alias bomb", aliasBomb, "its aliases make more than 10000 values"},
		{"nested flow sequences", strings.Repeat("[", deep) + strings.Repeat("]", deep), "nested deeper than 64 levels"},
		{"nested flow mappings", strings.Repeat("{a: ", deep) + strings.Repeat("}", deep), "nested deeper than 64 levels"},
		{"nested block sequences", strings.Repeat("- ", deep) + "x\n", "nested deeper than 64 levels"},
		{"one byte over the size limit", "tools: []\n#" + strings.Repeat("x", 1<<20), "larger than 1048576 bytes"},
	} {
		var err error
		n := allocated(func() { _, err = agent.ParseTools([]byte(tc.file)) })
		if !errors.Is(err, agent.ErrToolsFile) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an ErrToolsFile saying %q", tc.name, err, tc.want)
		}
		if n > toolsAllocBound {
			t.Errorf("%s: refusing it allocated %d MiB", tc.name, n>>20)
		}
	}

	// Aliases a file may well use are read.
	shared := "services:\n  s: {base_url: 'http://127.0.0.1:1'}\ntools:\n" +
		"  - {name: a, summary: A., service: s, method: POST, path: /v1/a, retry_mode: create,\n" +
		"     input_schema: &schema {type: object, properties: {text: {type: string}, on: {type: string, default: 2026-12-07}}}}\n" +
		"  - {name: b, summary: B., service: s, method: POST, path: /v1/b, retry_mode: create, input_schema: *schema}\n"
	if c, err := agent.ParseTools([]byte(shared)); err != nil || len(c.Names()) != 2 {
		t.Errorf("a file with a shared schema: %v", err)
	}
}
