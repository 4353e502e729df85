package console

import "fmt"

// recoveryFields are what the card of a retry after an unknown outcome says beside the replaced operation's
// state and last dispatch: what that operation was meant to do and what approving this request does about it
// (the summary's supersedes.original_intent and supersedes.planned_recovery; none on older approvals).
func recoveryFields(prior map[string]any) []Field {
	var out []Field
	if intent, ok := prior["original_intent"].(map[string]any); ok {
		v := fmt.Sprintf("%v under key %v", intent["kind"], intent["idempotency_key"])
		if r, ok := intent["resource"]; ok {
			v += fmt.Sprintf(", on %v", r)
		}
		out = append(out, Field{Label: "Its original intent", Value: v})
	}
	if plan, ok := prior["planned_recovery"].(string); ok {
		out = append(out, Field{Label: "Planned recovery", Value: plan})
	}
	return out
}
