package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/agent/agentmcp"
)

// lineWatch is a process's stderr, watched for one line.
type lineWatch struct {
	mu   sync.Mutex
	buf  strings.Builder
	want string
	hit  chan struct{}
	once sync.Once
}

func (l *lineWatch) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if l.want != "" && strings.Contains(l.buf.String(), l.want) {
		l.once.Do(func() { close(l.hit) })
	}
	return len(p), nil
}

// startMCP runs `retrysafe mcp` as a subprocess and connects the SDK's client to it over stdio.
func startMCP(t *testing.T, w *agentWorld, journal string, extra map[string]string, watch *lineWatch) (*mcp.ClientSession, *exec.Cmd) {
	t.Helper()
	cmd := w.command(extra, "mcp", "--journal", journal)
	cmd.Stderr = watch
	client := mcp.NewClient(&mcp.Implementation{Name: "retrysafe-test", Version: "v0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to retrysafe mcp: %v\n%s", err, watch.buf.String())
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, cmd
}

// call calls a tool and decodes its structured result.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (*mcp.CallToolResult, agent.Result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	var r agent.Result
	raw, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(raw, &r)
	return res, r
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func bodyID(t *testing.T, r agent.Result) string {
	t.Helper()
	var b struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(r.Body, &b); err != nil || b.ID == "" {
		t.Fatalf("no id in the body of %+v", r)
	}
	return b.ID
}

// TestMCPServer drives `retrysafe mcp` with the SDK's client: the tool list and its schemas, every tool
// called against the real services, tool errors that carry the service's code, and a server killed in the middle
// of a call that, called again with the same action_id, makes one effect.
func TestMCPServer(t *testing.T) {
	t.Parallel()
	w := startAgentWorld(t)
	dir := t.TempDir()
	journal := filepath.Join(dir, "mcp.journal")
	cs, _ := startMCP(t, w, journal, nil, &lineWatch{})

	list, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
		schema, _ := json.Marshal(tool.InputSchema)
		var s struct {
			Required   []string                  `json:"required"`
			Properties map[string]map[string]any `json:"properties"`
		}
		_ = json.Unmarshal(schema, &s)
		if !slices.Contains(s.Required, "action_id") || s.Properties["action_id"]["description"] != agentmcp.ActionIDDescription {
			t.Errorf("%s: action_id is not required with the contract's wording: %s", tool.Name, schema)
		}
		if tool.Annotations == nil || tool.Annotations.ReadOnlyHint != (tool.Name == "get_operation") {
			t.Errorf("%s: annotations %+v", tool.Name, tool.Annotations)
		}
		if tool.Name != "get_operation" && !strings.Contains(tool.Description, "action_id") {
			t.Errorf("%s: the description does not state the retry rule: %q", tool.Name, tool.Description)
		}
	}
	want := append(agent.DemoTools().Names(), "get_operation", "retry_action")
	slices.Sort(want)
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v; want %v", names, want)
	}

	ok := func(tool string, args map[string]any) agent.Result {
		t.Helper()
		res, r := call(t, cs, tool, args)
		if res.IsError || r.State != agent.StateSucceeded || r.OperationID == "" || r.NextStep == "" {
			t.Fatalf("%s: %s", tool, text(res))
		}
		return r
	}
	ticket := bodyID(t, ok("create_ticket", map[string]any{"action_id": "m-ticket", "project": "mcp", "title": "from mcp"}))
	ok("add_comment", map[string]any{"action_id": "m-comment", "id": ticket, "body": "looked at it"})
	ok("set_ticket_status", map[string]any{"action_id": "m-status", "id": ticket, "status": "resolved"})
	intent := bodyID(t, ok("create_payment_intent", map[string]any{"action_id": "m-pi", "order_id": "mcp-1", "amount_minor": 500, "currency": "USD"}))
	ok("capture_payment", map[string]any{"action_id": "m-capture", "intent_id": intent})
	ok("refund_payment", map[string]any{"action_id": "m-refund", "intent_id": intent, "amount_minor": 100})
	other := bodyID(t, ok("create_payment_intent", map[string]any{"action_id": "m-pi2", "order_id": "mcp-2", "amount_minor": 700, "currency": "USD"}))
	ok("cancel_payment", map[string]any{"action_id": "m-cancel", "intent_id": other})
	sha := func(c byte) string { return strings.Repeat(string(c), 40) }
	first := bodyID(t, ok("request_deploy", map[string]any{"action_id": "m-deploy1", "service": "api", "environment": "staging", "commit_sha": sha('a')}))
	second := bodyID(t, ok("request_deploy", map[string]any{"action_id": "m-deploy2", "service": "api", "environment": "staging", "commit_sha": sha('b')}))
	ok("rollback_deploy", map[string]any{"action_id": "m-rollback", "deploy_id": second})

	// Refusals are tool errors with the service's code.
	res, r := call(t, cs, "cancel_deploy", map[string]any{"action_id": "m-cancel-deploy", "deploy_id": first})
	if !res.IsError || r.State != agent.StateRefused || r.Code != "invalid_state" || !strings.Contains(text(res), "invalid_state") {
		t.Errorf("cancel of a finished deploy: %s; want a tool error with invalid_state", text(res))
	}
	// An approval: the capture above the threshold needs a person; request_approval names the approval.
	big := bodyID(t, ok("create_payment_intent", map[string]any{"action_id": "m-pi3", "order_id": "mcp-3", "amount": "5000.00", "currency": "USD"}))
	res, r = call(t, cs, "capture_payment", map[string]any{"action_id": "m-big", "intent_id": big})
	if res.IsError || r.State != agent.StateNeedsHuman || r.Code != "approval_required" || !strings.Contains(r.NextStep, "request_approval") {
		t.Errorf("capture above the threshold: %s", text(res))
	}
	ap := ok("request_approval", map[string]any{"action_id": "m-approval", "for_action": "m-big"})
	if ap.ApprovalID == "" || !strings.Contains(ap.NextStep, ap.ApprovalID) {
		t.Errorf("request_approval: %+v", ap)
	}
	res, _ = call(t, cs, "get_operation", map[string]any{"action_id": "m-ticket"})
	if res.IsError || !strings.Contains(text(res), "succeeded") || !strings.Contains(text(res), "attempt 1") {
		t.Errorf("get_operation: %s", text(res))
	}
	res, r = call(t, cs, "create_ticket", map[string]any{"action_id": "m-ticket", "project": "mcp", "title": "from mcp, changed"})
	if !res.IsError || !strings.Contains(text(res), "changed_intent") || ticketCount(t, w, "from mcp, changed") != 0 {
		t.Errorf("changed intent: %s", text(res))
	}
	if res, _ := call(t, cs, "create_ticket", map[string]any{"project": "mcp", "title": "no action"}); !res.IsError {
		t.Errorf("a call without action_id: %s", text(res))
	}
	if n := ticketCount(t, w, "from mcp"); n != 1 {
		t.Errorf("%d tickets; want 1", n)
	}
	_ = cs.Close()

	// Killed in the middle of a call (the request sent, the answer not read), then called again.
	kjournal := filepath.Join(dir, "killed.journal")
	watch := &lineWatch{want: "failpoint agent.after_send reached", hit: make(chan struct{})}
	killed, cmd := startMCP(t, w, kjournal, map[string]string{"RETRYSAFE_AGENT_FAILPOINTS": "agent.after_send=pause"}, watch)
	args := map[string]any{"action_id": "m-killed", "project": "mcp", "title": "killed mid-call"}
	go func() {
		_, _ = killed.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_ticket", Arguments: args})
	}()
	select {
	case <-watch.hit:
	case <-time.After(30 * time.Second):
		t.Fatalf("the server never reached the failpoint:\n%s", watch.buf.String())
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	again, _ := startMCP(t, w, kjournal, nil, &lineWatch{})
	res, r = call(t, again, "create_ticket", args)
	if res.IsError || r.State != agent.StateSucceeded {
		t.Fatalf("called again after the kill: %s", text(res))
	}
	if n := ticketCount(t, w, "killed mid-call"); n != 1 {
		t.Errorf("%d tickets after a kill mid-call and a second call; want 1", n)
	}
	if r.Attempts < 2 {
		t.Errorf("the second call made %d attempts in all; want the interrupted one and its retry", r.Attempts)
	}
	for _, j := range []string{journal, kjournal} {
		if rep, err := agent.VerifyJournal(j); err != nil || !rep.Intact() {
			t.Errorf("%s: %v %+v", j, err, rep.Problems)
		}
	}
	if raw, _ := os.ReadFile(journal); strings.Contains(string(raw), w.env["AGENT_API_KEY"]) {
		t.Error("the journal holds the API key")
	}
}

// rpcAnswer is one JSON-RPC response read from `retrysafe mcp`.
type rpcAnswer struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// pipeMCP runs `retrysafe mcp`, writes lines to its stdin and closes it, as a client that sends its requests
// and hangs up would: it returns the answers by id (as written), stderr, and the exit code.
func pipeMCP(t *testing.T, w *agentWorld, journal string, lines ...string) (map[string]rpcAnswer, string, int) {
	t.Helper()
	cmd := w.command(nil, "mcp", "--journal", journal)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	hung := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	defer hung.Stop()
	go func() {
		for _, l := range lines {
			if _, err := io.WriteString(stdin, l+"\n"); err != nil {
				break
			}
		}
		stdin.Close()
	}()
	answers := map[string]rpcAnswer{}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var a rpcAnswer
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("stdout line is not JSON-RPC: %v: %.300s", err, sc.Bytes())
		}
		if _, dup := answers[string(a.ID)]; dup {
			t.Errorf("two answers for id %s", a.ID)
		}
		answers[string(a.ID)] = a
	}
	err = cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code <= 0 {
		t.Fatalf("retrysafe mcp: %v\n%s", err, stderr.String())
	}
	return answers, stderr.String(), code
}

func rpc(id any, method string, params any) string {
	m := map[string]any{"jsonrpc": "2.0", "method": method}
	if id != nil {
		m["id"] = id
	}
	if params != nil {
		m["params"] = params
	}
	raw, _ := json.Marshal(m)
	return string(raw)
}

var mcpInitialize = []string{
	rpc(1, "initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "pipe", "version": "v0"}}),
	rpc(nil, "notifications/initialized", nil),
}

// toolResult decodes a tools/call answer.
func toolResult(t *testing.T, a rpcAnswer) (mcp.CallToolResult, agent.Result) {
	t.Helper()
	if a.Error != nil || a.Result == nil {
		t.Fatalf("answer %s: error %+v; want a tool result", a.ID, a.Error)
	}
	var res mcp.CallToolResult
	var structured struct {
		R agent.Result `json:"structuredContent"`
	}
	if err := errors.Join(json.Unmarshal(a.Result, &res), json.Unmarshal(a.Result, &structured)); err != nil {
		t.Fatalf("answer %s: %v", a.ID, err)
	}
	return res, structured.R
}

// TestMCPStdio drives `retrysafe mcp` over raw pipes as a client that writes its requests and closes stdin.
func TestMCPStdio(t *testing.T) {
	t.Parallel()
	w := startAgentWorld(t)
	dir := t.TempDir()

	// Every request read before the end of stdin is answered, and the call carried out and journaled.
	t.Run("answers before exiting on EOF", func(t *testing.T) {
		journal := filepath.Join(dir, "eof.journal")
		answers, stderr, code := pipeMCP(t, w, journal, append(mcpInitialize,
			rpc(2, "tools/list", nil),
			rpc(3, "tools/call", map[string]any{"name": "create_ticket",
				"arguments": map[string]any{"action_id": "eof", "project": "mcp", "title": "sent, then stdin closed"}}),
		)...)
		if code != 0 || len(answers) != 3 {
			t.Fatalf("exit %d, answers %v; want 0 and the three requests answered\n%s", code, slices.Collect(maps.Keys(answers)), stderr)
		}
		var init struct {
			Capabilities map[string]json.RawMessage `json:"capabilities"`
		}
		_ = json.Unmarshal(answers["1"].Result, &init)
		if string(init.Capabilities["tools"]) != "{}" {
			t.Errorf("tools capability %s; want {} (the list never changes)", init.Capabilities["tools"])
		}
		if !strings.Contains(string(answers["2"].Result), `"create_ticket"`) {
			t.Errorf("tools/list: %.300s", answers["2"].Result)
		}
		if _, r := toolResult(t, answers["3"]); r.State != agent.StateSucceeded {
			t.Errorf("the call: %+v", r)
		}
		if n := ticketCount(t, w, "sent, then stdin closed"); n != 1 {
			t.Errorf("%d tickets; want 1", n)
		}
		j, err := agent.ReadJournal(journal)
		if err != nil {
			t.Fatal(err)
		}
		if op, ok := j.Operation("eof"); !ok || op.State() != agent.StateSucceeded {
			t.Errorf("the journal does not hold the call settled: %v", ok)
		}
	})

	// A message too long or too deep is refused alone, answered by its id when it has one; the server keeps
	// serving, and its log names the refusal without the message.
	t.Run("refuses a hostile message and serves the next", func(t *testing.T) {
		journal := filepath.Join(dir, "hostile.journal")
		huge := rpc("huge", "tools/call", map[string]any{"name": "get_operation",
			"arguments": map[string]any{"action_id": strings.Repeat("A", 30<<20)}})
		nest := strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
		// As the TypeScript SDK writes a request: the id last.
		deep := `{"method":"tools/call","params":{"name":"get_operation","arguments":{"action_id":"x","n":` + nest + `}},"jsonrpc":"2.0","id":"deep"}`
		deepNote := `{"jsonrpc":"2.0","method":"notifications/progress","params":` + nest + `}`
		answers, stderr, code := pipeMCP(t, w, journal, append(mcpInitialize,
			huge, deep, deepNote, "not json at all", `{"jsonrpc":"1.0","id":"old","method":"tools/list"}`,
			rpc("unknown", "tools/call", map[string]any{"name": "drop_database", "arguments": map[string]any{}}),
			rpc("after", "tools/call", map[string]any{"name": "create_ticket",
				"arguments": map[string]any{"action_id": "after", "project": "mcp", "title": "after the hostile ones"}}),
		)...)
		if code != 0 {
			t.Fatalf("exit %d\n%.2000s", code, stderr)
		}
		for _, id := range []string{`"huge"`, `"deep"`, `"old"`} {
			if a, ok := answers[id]; !ok || a.Error == nil || a.Error.Code != -32600 {
				t.Errorf("id %s: %+v; want a JSON-RPC invalid request error", id, a)
			}
		}
		if m := answers[`"huge"`].Error; m == nil || !strings.Contains(m.Message, "4194304 bytes") {
			t.Errorf("the huge message's error does not name the limit: %+v", m)
		}
		if m := answers[`"deep"`].Error; m == nil || !strings.Contains(m.Message, "64 levels") {
			t.Errorf("the deep message's error does not name the limit: %+v", m)
		}
		res, r := toolResult(t, answers[`"unknown"`])
		if !res.IsError || !strings.Contains(string(answers[`"unknown"`].Result), `"code":"unknown_tool"`) {
			t.Errorf("an unknown tool: %s; want a tool error with code unknown_tool", answers[`"unknown"`].Result)
		}
		if res, r = toolResult(t, answers[`"after"`]); res.IsError || r.State != agent.StateSucceeded || ticketCount(t, w, "after the hostile ones") != 1 {
			t.Errorf("the call after the hostile messages: %+v", r)
		}
		if len(answers) != 6 {
			t.Errorf("answers %v; want initialize, huge, deep, old, unknown and after", slices.Collect(maps.Keys(answers)))
		}
		if n := strings.Count(stderr, "mcp: message refused"); n != 5 || strings.Contains(stderr, "AAAA") || strings.Contains(stderr, "[[[[") {
			t.Errorf("%d refusals logged (want 5, without their content):\n%.2000s", n, stderr)
		}
	})
}
