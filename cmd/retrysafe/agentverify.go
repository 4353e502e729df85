package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// exitRemade is `agent verify` finding operations the services had lost, and making every one of them again.
const exitRemade = 7

// runAgentVerify asks the services for every operation the journal says they acknowledged, sends again under
// its key each one they lost, prints one check per action and exits by what it found: 0 nothing lost, 7 lost
// and made again, 3 something lost that was not made again, or that could not be checked.
func runAgentVerify(ctx context.Context, a *agent.Agent, enc *json.Encoder) error {
	checks, err := a.Verify(ctx)
	for _, c := range checks {
		if encErr := enc.Encode(c); encErr != nil {
			return encErr
		}
	}
	if err != nil {
		return exitError{code: 1, err: fmt.Errorf("agent verify: %w", err)}
	}
	return verifyExit(checks)
}

// verifyExit is the exit of agent verify for checks, with what was lost and made again in words.
func verifyExit(checks []agent.Check) error {
	var remade, open, unchecked []string
	for _, c := range checks {
		switch {
		case c.Record == agent.RecordUnchecked:
			unchecked = append(unchecked, c.ActionID)
		case c.Record == agent.RecordPresent:
		case c.Remade:
			remade = append(remade, c.ActionID)
		default:
			open = append(open, fmt.Sprintf("%s (%s)", c.ActionID, c.Result.State))
		}
	}
	if len(open) > 0 || len(unchecked) > 0 {
		return exitError{code: exitNeedsHuman, err: fmt.Errorf("agent verify: lost and not made again: %s; not checked "+
			"(the service could not be asked): %s; made again: %s; see agent show", list(open), list(unchecked), list(remade))}
	}
	if len(remade) > 0 {
		return exitError{code: exitRemade, err: fmt.Errorf("agent verify: the services had lost %d acknowledged actions, "+
			"each made again under its key: %s", len(remade), list(remade))}
	}
	return nil
}

func list(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}
