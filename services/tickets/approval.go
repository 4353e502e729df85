package tickets

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/retrysafe/retrysafe/pkg/httpjson"
)

// ApprovalPolicy says which new tickets need a person's approval before they are created: those of a listed
// priority or project. Its zero value needs none.
type ApprovalPolicy struct {
	Priorities []Priority
	Projects   []string
}

// needs reports whether cmd, validated (its priority set), needs an approval.
func (p ApprovalPolicy) needs(cmd CreateTicket) bool {
	return slices.Contains(p.Projects, cmd.Project) || cmd.Priority != nil && slices.Contains(p.Priorities, *cmd.Priority)
}

// describeTicket is the approval.Route.Describe of POST /v1/tickets: the same decoding and validation as
// createTicket, and the card a person decides on: the project and title the ticket will have, its priority, and
// why it needs an approval.
func (s *Server) describeTicket(_ context.Context, _ string, _ map[string]string, body json.RawMessage) (any, map[string]any, error) {
	var cmd CreateTicket
	if err := httpjson.DecodeBytes(body, &cmd); err != nil {
		return nil, nil, err
	}
	if err := cmd.Validate(); err != nil {
		return nil, nil, err
	}
	summary := map[string]any{"action": "create_ticket", "project": cmd.Project, "title": cmd.Title, "priority": *cmd.Priority}
	switch {
	case slices.Contains(s.Approval.Projects, cmd.Project):
		summary["needs_approval_because"] = "project " + cmd.Project + " needs an approval for new tickets"
	case slices.Contains(s.Approval.Priorities, *cmd.Priority):
		summary["needs_approval_because"] = "priority " + string(*cmd.Priority) + " needs an approval"
	}
	if cmd.SourceEventID != nil {
		summary["source_event_id"] = *cmd.SourceEventID
	}
	return cmd, summary, nil
}
