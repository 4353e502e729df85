package agent

import (
	"strings"
	"testing"
	"time"
)

// What a retry with the key must not take out of needs_human: each says what to do instead.
func TestNotRetryable(t *testing.T) {
	t.Parallel()
	now := time.Now()
	expires := now.Add(30 * time.Minute).UTC().Format(time.RFC3339Nano)
	for _, tc := range []struct {
		name string
		op   Operation
		want string
	}{
		{"budget spent", Operation{Settled: &Settlement{State: StateNeedsHuman, Reason: "attempt budget spent"}}, ""},
		{"held for the superseded", Operation{Settled: &Settlement{State: StateNeedsHuman, Code: CodeSupersededUnknown}}, "settle that one first"},
		{"approval", Operation{Settled: &Settlement{State: StateNeedsHuman, Code: "approval_required"}}, "approval"},
		{"duplicate", Operation{Settled: &Settlement{State: StateNeedsHuman, Code: "duplicate_effect_confirmed"}}, "corrects it"},
		{"key expiring", Operation{IdempotencyKey: "idk_x", Settled: &Settlement{State: StateNeedsHuman},
			Observations: []*Observation{{Kind: ObsLookup, KeyExpiresAt: expires, At: now.UTC().Format(time.RFC3339Nano)}}}, "supersedes this one"},
	} {
		if got := notRetryable(&tc.op, now); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q; want %q", tc.name, got, tc.want)
		}
	}
}
