package agentmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// addRetryAction adds retry_action: agent.Retry over MCP, journaled as asked by "mcp:" and the client's name.
func addRetryAction(s *mcp.Server, a *agent.Agent) {
	s.AddTool(&mcp.Tool{
		Name:  "retry_action",
		Title: "Retry a needs_human action with its key",
		Description: "Take an action that ended needs_human (its attempt budget spent, or no settled answer in time) out of " +
			"needs_human: the agent tries it again with the same idempotency key, so it still happens at most once, and " +
			"journals that this client asked, and why. Refused for an action that waits for an approval, is held back for " +
			"the action it supersedes, or whose key the service forgets: next_step says what to do instead. A changed " +
			"intent is never a retry: call the tool with a new action_id and supersedes_action_id.",
		InputSchema: map[string]any{"type": "object", "required": []string{"action_id", "reason"}, "additionalProperties": false,
			"properties": map[string]any{
				"action_id": map[string]any{"type": "string", "minLength": 1, "maxLength": 200, "description": ActionIDDescription},
				"reason":    map[string]any{"type": "string", "minLength": 1, "maxLength": agent.MaxEvidence, "description": "why it should go again now (what changed), journaled"},
				"budget":    map[string]any{"type": "integer", "minimum": 1, "maximum": 100, "description": "attempts it may make from now (default the agent's budget)"},
			}},
		OutputSchema: resultSchema,
		Annotations: &mcp.ToolAnnotations{Title: "Retry a needs_human action with its key", IdempotentHint: false,
			DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in struct {
			ActionID string `json:"action_id"`
			Reason   string `json:"reason"`
			Budget   int    `json:"budget"`
		}
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || in.ActionID == "" || in.Reason == "" {
			return toolError("bad_arguments", "action_id and reason (strings) are required; budget is an integer"), nil
		}
		by := "mcp:unknown-client"
		if p := req.Session.InitializeParams(); p != nil && p.ClientInfo != nil && p.ClientInfo.Name != "" {
			by = "mcp:" + p.ClientInfo.Name
		}
		if len(by) > 255 {
			by = by[:255]
		}
		res, err := a.Retry(ctx, in.ActionID, agent.RetryRequest{By: agent.Printable(by), Reason: in.Reason, Budget: in.Budget})
		switch {
		case errors.Is(err, agent.ErrNotRetryable), errors.Is(err, agent.ErrNotNeedsHuman):
			return toolErrorWith("not_retryable", err.Error()+". Nothing was sent.", res), nil
		case errors.Is(err, agent.ErrUnknownAction):
			return toolError("unknown_action", fmt.Sprintf("no action %q in the journal", in.ActionID)), nil
		case errors.Is(err, agent.ErrBadArguments):
			return toolError("bad_arguments", err.Error()), nil
		case err != nil:
			return toolErrorWith("internal", "the agent stopped before the operation settled ("+err.Error()+"); call get_operation", res), nil
		}
		out := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: resultText(res, nil)}}, StructuredContent: res}
		if res.State == agent.StateRefused || res.State == agent.StateFailed {
			out.IsError = true
		}
		return out, nil
	})
}
