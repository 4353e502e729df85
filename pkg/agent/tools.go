package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"

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

// Service names, which pick the base URL.
const (
	Tickets  = "tickets"
	Payments = "payments"
	Deploys  = "deploys"
)

// Tool is one write the agent can make: where it goes and how it may be repeated.
type Tool struct {
	Name    string
	Summary string
	Service string // tickets, payments, deploys; empty for request_approval (the target's service)
	Method  string
	Route   string // route template, path parameters in braces
	Mode    RetryMode
	// Keyed tools send Idempotency-Key; the declared-state routes take none.
	Keyed bool
	// Approval tools accept approval_id (sent as Approval-Id, outside the fingerprint).
	Approval bool
	// Properties are the body's fields as JSON Schema; path parameters are added as required strings.
	Properties map[string]any
	Required   []string
}

var (
	str     = map[string]any{"type": "string"}
	integer = map[string]any{"type": "integer", "minimum": 1}
	amount  = map[string]any{"type": "string", "pattern": `^[0-9]+(\.[0-9]+)?$`, "description": `decimal string, "12.30"`}
)

// Tools is the catalogue, by name.
var Tools = map[string]Tool{}

func init() {
	for _, t := range []Tool{
		{Name: "create_ticket", Summary: "Create a support ticket.", Service: Tickets, Method: "POST", Route: "/v1/tickets",
			Mode: Create, Keyed: true, Required: []string{"project", "title"}, Properties: map[string]any{
				"project": str, "title": str, "description": str,
				"priority":        map[string]any{"type": "string", "enum": []string{"low", "normal", "high", "urgent"}},
				"source_event_id": map[string]any{"type": "string", "description": "the event that caused the ticket: one ticket per event"},
			}},
		{Name: "add_comment", Summary: "Add a comment to a ticket.", Service: Tickets, Method: "POST", Route: "/v1/tickets/{id}/comments",
			Mode: Create, Keyed: true, Required: []string{"body"}, Properties: map[string]any{"body": str}},
		{Name: "set_ticket_status", Summary: "Declare a ticket's status.", Service: Tickets, Method: "PUT", Route: "/v1/tickets/{id}/status",
			Mode: Converge, Required: []string{"status"}, Properties: map[string]any{
				"status": map[string]any{"type": "string", "enum": []string{"open", "resolved", "closed"}},
			}},
		{Name: "create_payment_intent", Summary: "Create a payment intent: places an authorization at the payment provider.",
			Service: Payments, Method: "POST", Route: "/v1/payment_intents", Mode: Financial, Keyed: true,
			Required: []string{"order_id", "currency"}, Properties: map[string]any{
				"order_id": str, "amount": amount, "amount_minor": integer, "description": str,
				"currency": map[string]any{"type": "string", "pattern": "^[A-Z]{3}$"},
			}},
		{Name: "capture_payment", Summary: "Capture an authorized payment intent (the money moves).", Service: Payments, Method: "POST",
			Route: "/v1/payment_intents/{intent_id}/capture", Mode: Financial, Keyed: true, Approval: true,
			Properties: map[string]any{"amount": amount, "amount_minor": integer}},
		{Name: "cancel_payment", Summary: "Cancel (void) a payment intent before capture.", Service: Payments, Method: "POST",
			Route: "/v1/payment_intents/{intent_id}/cancel", Mode: Destructive, Keyed: true, Properties: map[string]any{}},
		{Name: "refund_payment", Summary: "Refund captured money of a payment intent.", Service: Payments, Method: "POST",
			Route: "/v1/payment_intents/{intent_id}/refunds", Mode: Financial, Keyed: true, Approval: true,
			Properties: map[string]any{"amount": amount, "amount_minor": integer, "reason": str}},
		{Name: "request_deploy", Summary: "Deploy a service to an environment from an immutable reference (artifact digest or full commit SHA).",
			Service: Deploys, Method: "POST", Route: "/v1/deploys", Mode: Destructive, Keyed: true, Approval: true,
			Required: []string{"service", "environment"}, Properties: map[string]any{
				"service": str, "environment": str, "artifact": str, "commit_sha": str,
				"expected_environment_version": map[string]any{"type": "integer", "minimum": 0},
			}},
		{Name: "cancel_deploy", Summary: "Cancel a deploy that has not started activating.", Service: Deploys, Method: "POST",
			Route: "/v1/deploys/{deploy_id}/cancel", Mode: Converge, Properties: map[string]any{}},
		{Name: "rollback_deploy", Summary: "Roll back the environment's current deploy (a new deploy of the previous reference).",
			Service: Deploys, Method: "POST", Route: "/v1/deploys/{deploy_id}/rollback", Mode: Destructive, Keyed: true, Approval: true,
			Properties: map[string]any{"expected_environment_version": map[string]any{"type": "integer", "minimum": 0}}},
		{Name: "request_approval", Summary: "Ask a person to approve one exact write of another action (after approval_required): " +
			"give for_action, the action_id that needs it.", Method: "POST", Route: "/v1/approvals", Mode: Create, Keyed: true,
			Required: []string{"for_action"}, Properties: map[string]any{
				"for_action": map[string]any{"type": "string", "description": "the action_id of the write to approve"},
			}},
	} {
		Tools[t.Name] = t
	}
}

// ToolNames lists the tools in a stable order.
func ToolNames() []string {
	names := make([]string, 0, len(Tools))
	for n := range Tools {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// PathParams are the route's parameter names.
func (t Tool) PathParams() []string {
	var out []string
	for _, seg := range strings.Split(t.Route, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			out = append(out, seg[1:len(seg)-1])
		}
	}
	return out
}

// Schema is the JSON Schema of the tool's arguments (path parameters inside), without action_id.
func (t Tool) Schema() map[string]any {
	props := map[string]any{}
	for k, v := range t.Properties {
		props[k] = v
	}
	required := slices.Clone(t.Required)
	for _, p := range t.PathParams() {
		props[p] = map[string]any{"type": "string", "description": "path parameter: the " + strings.TrimSuffix(p, "_id") + " id"}
		required = append(required, p)
	}
	if t.Approval {
		props["approval_id"] = map[string]any{"type": "string", "description": "an approved approval's id (after approval_required); sent as Approval-Id, not part of the intent"}
	}
	slices.Sort(required)
	return map[string]any{"type": "object", "properties": props, "required": required}
}

// request is a tool call made concrete: everything the HTTP send needs except lineage headers.
type request struct {
	path        string
	body        []byte // canonical JSON
	approvalID  string
	fingerprint string
	args        json.RawMessage // canonical args without approval_id: what the intent is
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
