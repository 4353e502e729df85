package agentmcp_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/agent/agentmcp"
)

// lockedBuffer is a log destination written by the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The transport's edges: CRLF and blank lines are fine; a message over the limits is answered by its
// top-level id wherever it stands, only when it is a request (never a response); a batch is refused request by
// request; and Run returns once stdin ended and every request read was answered.
func TestTransportEdges(t *testing.T) {
	t.Parallel()
	a, err := agent.Open(filepath.Join(t.TempDir(), "t.journal"), agent.Config{TicketsURL: "http://127.0.0.1:1", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}` + "\r",
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		``,
		`   `,
		`{"jsonrpc":"2.0","id":2,"result":"` + strings.Repeat("A", agentmcp.MaxMessageBytes) + `"}`,
		`{"jsonrpc":"2.0","error":{"code":1,"message":"` + strings.Repeat("A", agentmcp.MaxMessageBytes) + `"},"id":2}`,
		// The TypeScript SDK writes the id last.
		`{"method":"tools/call","params":{"name":"get_operation","arguments":{"action_id":"` + strings.Repeat("A", agentmcp.MaxMessageBytes) + `"}},"jsonrpc":"2.0","id":8}`,
		`{"method":"tools/list","params":{"a":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `},"jsonrpc":"2.0","id":"nine"}`,
		`{"method":"tools/list","params":{"id":"not this one","a":["}",{"id":3}]},"jsonrpc":"2.0","id":"te\"n","x":` + nested(agentmcp.MaxMessageDepth) + `}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/list","params":` + nested(agentmcp.MaxMessageDepth-1) + `}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/list","params":` + nested(agentmcp.MaxMessageDepth) + `}`,
		`[{"jsonrpc":"2.0","id":4,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":5,"method":"ping"}]`,
		`{"jsonrpc":"2.0","id":{"no":"objects"},"method":"ping"}`,
		`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"get_operation","arguments":{"action_id":"none"}}}`,
	}, "\n") // the last line ends with the input, no newline
	var out bytes.Buffer
	var log lockedBuffer
	tr := &agentmcp.Transport{In: io.NopCloser(strings.NewReader(in)), Out: &out, Logger: slog.New(slog.NewTextHandler(&log, nil))}
	if err := agentmcp.NewServer(a, "test").Run(t.Context(), tr); err != nil {
		t.Fatalf("run: %v", err)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var m struct {
			ID    json.RawMessage `json:"id"`
			Error *struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		got[string(m.ID)] = "result"
		if m.Error != nil {
			got[string(m.ID)] = "error"
		}
	}
	want := map[string]string{"1": "result", "3": "result", "4": "error", "5": "error", "6": "result", "7": "error",
		"8": "error", `"nine"`: "error", `"te\"n"`: "error"}
	if len(got) != len(want) {
		t.Errorf("answers %v; want %v", got, want)
	}
	for id, kind := range want {
		if got[id] != kind {
			t.Errorf("id %s: %q; want %s (all: %v)", id, got[id], kind, got)
		}
	}
	if n := strings.Count(log.String(), "mcp: message refused"); n != 10 || strings.Contains(log.String(), "AAAA") {
		t.Errorf("%d refusals logged; want 10 (three too long, two of them responses; three too deep; three batch members; the object id), without content:\n%s", n, log.String())
	}
}

// nested is n objects, one inside the other, the last holding a string of brackets (which do not nest).
func nested(n int) string {
	return strings.Repeat(`{"a":`, n) + `"[[[{{{"` + strings.Repeat("}", n)
}

// Every call is answered with its id as the client wrote it, byte for byte: numbers beyond int64 (which the
// SDK alone would write back as -9223372036854775808), fractions, exponents, a negative zero, strings written
// with escapes, and the ids the SDK holds as they are.
func TestTransportEchoesIDsExactly(t *testing.T) {
	t.Parallel()
	a, err := agent.Open(filepath.Join(t.TempDir(), "t.journal"), agent.Config{TicketsURL: "http://127.0.0.1:1", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ids := []string{`9223372036854775808`, `-9223372036854775809`, `123456789012345678901234567890`, `1.5`, `1e3`, `-0`,
		`2.0`, `"\u0041"`, `"a\/b"`, `"<tag>"`, `7`, `"plain"`, `-9223372036854775808`}
	lines := []string{`{"jsonrpc":"2.0","id":18446744073709551616,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`}
	for _, id := range ids {
		lines = append(lines, `{"jsonrpc":"2.0","id": `+id+` ,"method":"tools/list"}`)
	}
	var out bytes.Buffer
	tr := &agentmcp.Transport{In: io.NopCloser(strings.NewReader(strings.Join(lines, "\n"))), Out: &out,
		Logger: slog.New(slog.DiscardHandler)}
	if err := agentmcp.NewServer(a, "test").Run(t.Context(), tr); err != nil {
		t.Fatalf("run: %v", err)
	}
	answered := map[string]int{}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil || m.Result == nil {
			t.Fatalf("answer %s: %v", sc.Bytes(), err)
		}
		answered[string(m.ID)]++
	}
	for _, id := range append(ids, `18446744073709551616`) {
		if answered[id] != 1 {
			t.Errorf("id %s answered %d times; want once, as written (answers: %v)", id, answered[id], answered)
		}
	}
	if len(answered) != len(ids)+1 {
		t.Errorf("%d ids answered; want %d: %v", len(answered), len(ids)+1, answered)
	}
}
