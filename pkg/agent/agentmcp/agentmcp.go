// Package agentmcp serves pkg/agent's tools over the Model Context Protocol (the official Go SDK), so that a
// model calls create_ticket, capture_payment, ... with an action_id and the journal keeps the promise: one
// effect per action_id, whatever the model, the network or this process does.
//
//	a, _ := agent.Open("agent.journal", cfg)
//	defer a.Close()
//	err := agentmcp.NewServer(a, "v1").Run(ctx, &agentmcp.Transport{In: os.Stdin, Out: os.Stdout})
//
// Every tool's input requires action_id; results carry the operation id, the state and the next step in words;
// refusals are tool errors (isError) carrying the service's code, never a failure of the server.
//
// [Transport] is the stdio transport to serve with: it refuses a hostile message alone (see [MaxMessageBytes]
// and [MaxMessageDepth]) and answers every request read before its input ended.
package agentmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// ActionIDDescription is the wording of action_id in every input schema.
const ActionIDDescription = "a name you choose once for this intended action; call again with the same name to retry; a new action needs a new name"

// NewServer returns an MCP server with one tool per agent tool plus get_operation, all backed by a.
func NewServer(a *agent.Agent, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "retrysafe", Title: "retrysafe agent tools", Version: version}, &mcp.ServerOptions{
		Instructions: "Writes to the tickets, payments and deploys services. Give every intended action its own action_id and " +
			"reuse it for every retry of that action: the agent keeps one operation and one idempotency key per action_id in a " +
			"local journal, so a retry never doubles an effect. A result with state unknown, open or in_progress means: call again " +
			"with the same action_id. Never invent a new action_id to retry.",
	})
	for _, name := range agent.ToolNames() {
		t := agent.Tools[name]
		s.AddTool(toolFor(t), handlerFor(a, t))
	}
	s.AddTool(&mcp.Tool{
		Name:        "get_operation",
		Title:       "Show an action's operation",
		Description: "What the journal knows about an action: its operation id, state, attempts and observations, and the next step. Read-only: safe to call again at any time.",
		InputSchema: map[string]any{"type": "object", "required": []string{"action_id"}, "properties": map[string]any{
			"action_id": map[string]any{"type": "string", "description": ActionIDDescription},
		}},
		Annotations: &mcp.ToolAnnotations{Title: "Show an action's operation", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in struct {
			ActionID string `json:"action_id"`
		}
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || in.ActionID == "" {
			return toolError("bad_arguments", "action_id (a string) is required"), nil
		}
		op, ok := a.Operation(in.ActionID)
		if !ok {
			return toolError("unknown_action", fmt.Sprintf("no action %q in the journal: nothing was ever sent for it", in.ActionID)), nil
		}
		var timeline strings.Builder
		op.WriteTimeline(&timeline)
		res := a.Result(op)
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: summary(res) + "\n\n" + timeline.String()}},
			StructuredContent: res,
		}, nil
	})
	return s
}

func ptr[T any](v T) *T { return &v }

func toolFor(t agent.Tool) *mcp.Tool {
	schema := t.Schema()
	props := schema["properties"].(map[string]any)
	props["action_id"] = map[string]any{"type": "string", "minLength": 1, "maxLength": 200, "description": ActionIDDescription}
	props["supersedes_action_id"] = map[string]any{"type": "string",
		"description": "only for a changed intent: the action_id whose intent this new action replaces"}
	schema["required"] = append([]string{"action_id"}, schema["required"].([]string)...)
	destructive := t.Mode == agent.Destructive || t.Mode == agent.Financial && t.Name != "create_payment_intent" || t.Mode == agent.Converge
	return &mcp.Tool{
		Name:        t.Name,
		Title:       t.Summary,
		Description: t.Summary + " " + t.Mode.Rule() + " Retry mode: " + string(t.Mode) + ".",
		InputSchema: schema,
		Annotations: &mcp.ToolAnnotations{
			Title: t.Summary,
			// Writes, all of them. Idempotent per action_id: the same arguments (action_id included) have no
			// further effect. Destructive where the effect overwrites, moves money or cannot be undone.
			ReadOnlyHint: false, IdempotentHint: true, DestructiveHint: ptr(destructive), OpenWorldHint: ptr(true),
		},
	}
}

func handlerFor(a *agent.Agent, t agent.Tool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(req.Params.Arguments, &fields); err != nil || fields == nil {
			return toolError("bad_arguments", "the arguments must be a JSON object with action_id"), nil
		}
		var actionID, supersedes string
		if err := json.Unmarshal(fields["action_id"], &actionID); err != nil || actionID == "" {
			return toolError("bad_arguments", "action_id (a string) is required: "+ActionIDDescription), nil
		}
		if raw, ok := fields["supersedes_action_id"]; ok {
			if err := json.Unmarshal(raw, &supersedes); err != nil {
				return toolError("bad_arguments", "supersedes_action_id must be a string"), nil
			}
		}
		delete(fields, "action_id")
		delete(fields, "supersedes_action_id")
		args, _ := json.Marshal(fields)
		res, err := a.Do(ctx, actionID, t.Name, args, agent.DoOptions{Supersedes: supersedes})
		switch {
		case errors.Is(err, agent.ErrChangedIntent):
			return toolErrorWith("changed_intent", err.Error()+". Nothing was sent.", res), nil
		case errors.Is(err, agent.ErrBadArguments), errors.Is(err, agent.ErrUnknownAction):
			return toolError("bad_arguments", err.Error()), nil
		case err != nil:
			return toolErrorWith("internal", "the agent stopped before the operation settled ("+err.Error()+"); call again with the same action_id", res), nil
		}
		out := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: summary(res)}}, StructuredContent: res}
		if res.State == agent.StateRefused || res.State == agent.StateFailed {
			out.IsError = true
		}
		return out, nil
	}
}

// summary is the result in words, first the line a model must act on.
func summary(r agent.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "state: %s\nnext step: %s\noperation_id: %s\naction_id: %s\n", r.State, r.NextStep, r.OperationID, r.ActionID)
	if r.Code != "" {
		fmt.Fprintf(&b, "code: %s\n", r.Code)
	}
	if r.HTTPStatus != 0 {
		fmt.Fprintf(&b, "http_status: %d\n", r.HTTPStatus)
	}
	if r.ServerOperationID != "" {
		fmt.Fprintf(&b, "server_operation_id: %s\n", r.ServerOperationID)
	}
	if r.ApprovalID != "" {
		fmt.Fprintf(&b, "approval_id: %s\n", r.ApprovalID)
	}
	if len(r.Body) > 0 {
		fmt.Fprintf(&b, "body: %s\n", r.Body)
	}
	return b.String()
}

func toolError(code, msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "error " + code + ": " + msg}},
		StructuredContent: map[string]any{"code": code, "error": msg}}
}

func toolErrorWith(code, msg string, r agent.Result) *mcp.CallToolResult {
	sc := map[string]any{"code": code, "error": msg}
	if r.OperationID != "" {
		raw, _ := json.Marshal(r)
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		maps.Copy(m, sc)
		sc = m
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "error " + code + ": " + msg}}, StructuredContent: sc}
}
