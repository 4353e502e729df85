package agent

import (
	"encoding/json"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
)

// Tools are the tools the agent offers.
func (a *Agent) Tools() *Catalog { return a.cfg.Tools }

// check bounds the depth of args, validates them against the tool's input schema, then prepares the request:
// a call refused here has journaled and sent nothing.
func (t Tool) check(args json.RawMessage) (request, error) {
	if err := jsondepth.Check(args); err != nil {
		return request{}, &ArgumentError{Tool: t.Name, Problems: []ArgumentProblem{{Message: err.Error()}}}
	}
	obj := args
	if len(obj) == 0 {
		obj = json.RawMessage(`{}`)
	}
	if err := t.validate(obj); err != nil {
		return request{}, err
	}
	if t.Command != nil {
		return t.prepareCommand(args)
	}
	return t.prepare(args)
}

// takesApproval reports whether the tools file gives the tool named name an approval_id.
func (a *Agent) takesApproval(name string) bool {
	t, ok := a.cfg.Tools.Tool(name)
	return ok && t.Approval
}

// isApprovalRequest reports whether op asks for a person's approval of another action: its tool is of kind
// request_approval in the tools file.
func (a *Agent) isApprovalRequest(op *Operation) bool {
	t, ok := a.cfg.Tools.Tool(op.Tool)
	return ok && t.ApprovalRequest
}

// operationsRoute is where op's service serves its operations, "" when the tools file names none.
func (a *Agent) operationsRoute(op *Operation) string {
	s, _ := a.cfg.Tools.Service(op.Service)
	return s.Operations
}
