package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// RetryMode is what a tool declares about repeating it; it decides what the agent may do after an unknown
// outcome.
type RetryMode string

const (
	// ReadOnly changes nothing: it is sent again freely.
	ReadOnly RetryMode = "read_only"
	// Converge declares a final state (a status, a cancellation): sending it again converges to the same state.
	Converge RetryMode = "converge"
	// Create makes something once per idempotency key: after a lost answer the same key goes again, since the
	// services dedupe by key, after a lookup when one is possible.
	Create RetryMode = "create"
	// Financial moves money: after a lost answer the operation is looked up first, and sent again with the same
	// key only once the lookup answered.
	Financial RetryMode = "financial"
	// Destructive cannot be undone: like Financial, looked up first.
	Destructive RetryMode = "destructive"
)

// Rule is the tool's retry rule in one sentence, for descriptions (MCP) and help.
func (m RetryMode) Rule() string {
	switch m {
	case ReadOnly:
		return "Read-only: safe to call again at any time."
	case Converge:
		return "Declares a final state: after a lost answer, or when called again with the same action_id, the same state is sent again, which changes nothing if it already happened."
	case Create:
		return "Runs once per action_id: after a lost answer the agent retries with the same idempotency key, so calling again with the same action_id never creates a second one."
	case Financial:
		return "Moves money once per action_id: after a lost answer the agent looks the operation up before it sends again with the same key, and never under a new key."
	case Destructive:
		return "Cannot be undone and runs once per action_id: after a lost answer the agent looks the operation up before it sends again with the same key."
	}
	return ""
}

// The demo services' names in DemoTools.
const (
	Tickets  = "tickets"
	Payments = "payments"
	Deploys  = "deploys"
)

// Tool is one write the agent can make: where it goes, what it takes and how it may be repeated. Tools come from
// a tools file (LoadTools, ParseTools; DemoTools for the demo services).
type Tool struct {
	Name    string
	Summary string
	// Service names the service, in the tools file, whose base URL the route is under; empty for an approval
	// request, which goes to its target's service.
	Service string
	Method  string
	Route   string // route template, path parameters in braces
	Mode    RetryMode
	// Keyed tools send Idempotency-Key; the declared-state routes take none.
	Keyed bool
	// Approval tools accept approval_id (sent as Approval-Id, outside the fingerprint).
	Approval bool
	// ApprovalRequest tools ask a person to approve the write of another action (for_action): the body is built
	// from that action's request and sent to its service's approvals route.
	ApprovalRequest bool
	// InputSchema is the JSON Schema of the arguments, path parameters inside, approval_id and action_id not.
	InputSchema map[string]any
	// Command is a command tool's command (kind command): it runs on a host of the tools file, not over HTTP.
	Command *CommandSpec

	schema *jsonschema.Schema // InputSchema compiled, approval_id added
}

// PathParams are the route's parameter names; a command tool's are its command's placeholders.
func (t Tool) PathParams() []string {
	if t.Command != nil {
		return t.Command.placeholders()
	}
	var out []string
	for _, seg := range strings.Split(t.Route, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			out = append(out, seg[1:len(seg)-1])
		}
	}
	return out
}

// Schema is the JSON Schema of the tool's arguments (path parameters inside), without action_id: the tools
// file's input schema, with approval_id for approval tools. It is a new copy on every call.
func (t Tool) Schema() map[string]any {
	schema := deepCopy(t.InputSchema).(map[string]any)
	if t.Approval {
		props, _ := schema["properties"].(map[string]any)
		if props == nil {
			props = map[string]any{}
			schema["properties"] = props
		}
		props["approval_id"] = map[string]any{"type": "string", "description": "an approved approval's id (after approval_required); sent as Approval-Id, not part of the intent"}
	}
	return schema
}

// request is a tool call made concrete: everything the HTTP send needs except lineage headers.
type request struct {
	path        string
	body        []byte // canonical JSON
	approvalID  string
	fingerprint string
	args        json.RawMessage // canonical args without approval_id: what the intent is
	// command and check are a command tool's command line and check, arguments substituted.
	command, check string
}

// prepare checks args against the tool and computes the intent's fingerprint: SHA-256 over the canonical JSON
// (RFC 8785) of tool, method, route template and arguments, so key order and spacing do not change it.
func (t Tool) prepare(args json.RawMessage) (request, error) {
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage(`{}`)
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(args))
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return request{}, fmt.Errorf("%w: %s arguments must be a JSON object", ErrBadArguments, t.Name)
	}
	var r request
	if raw, ok := fields["approval_id"]; ok {
		if !t.Approval {
			return request{}, fmt.Errorf("%w: %s takes no approval_id", ErrBadArguments, t.Name)
		}
		if err := json.Unmarshal(raw, &r.approvalID); err != nil || !validID(r.approvalID) {
			// It goes in the Approval-Id header: a line break there would fail every attempt before it is sent.
			return request{}, fmt.Errorf("%w: approval_id must be an approval's id: 1 to 200 printable ASCII characters, no spaces", ErrBadArguments)
		}
		delete(fields, "approval_id")
	}
	canonArgs, err := auditchain.Canonical(fields)
	if err != nil {
		return request{}, fmt.Errorf("%w: %v", ErrBadArguments, err)
	}
	r.args = canonArgs
	path := t.Route
	for _, p := range t.PathParams() {
		var v string
		raw, ok := fields[p]
		if !ok || json.Unmarshal(raw, &v) != nil || v == "" {
			return request{}, fmt.Errorf("%w: %s needs %q (a string) in its arguments", ErrBadArguments, t.Name, p)
		}
		path = strings.Replace(path, "{"+p+"}", url.PathEscape(v), 1)
		delete(fields, p)
	}
	r.path = path
	if r.body, err = auditchain.Canonical(fields); err != nil {
		return request{}, fmt.Errorf("%w: %v", ErrBadArguments, err)
	}
	fp, err := auditchain.Canonical(map[string]any{"tool": t.Name, "method": t.Method, "route": t.Route, "args": canonArgs})
	if err != nil {
		return request{}, err
	}
	r.fingerprint = sha256Hex(fp)
	return r, nil
}

// validID reports whether s can be an id the services issued: what travels in a header needs no more.
func validID(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
