package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// verifyJournalAndGrants is `audit verify --journal`: the journal's chain (verifyJournal), then, when the journal
// sent writes under grants and DATABASE_URL is set, its grant ids against the service's grant records.
func verifyJournalAndGrants(ctx context.Context, inv invocation, path string) error {
	if err := verifyJournal(inv.stdout, path); err != nil {
		return err
	}
	attempts, err := agent.JournalGrants(path)
	if err != nil {
		return exitError{code: 2, err: err}
	}
	if len(attempts) == 0 {
		return nil
	}
	grants := grantIDs(attempts)
	if inv.cfg.DatabaseDefaulted {
		fmt.Fprintf(inv.stdout, "grants: %d attempts under %d grants, not checked against the service's records (set DATABASE_URL)\n",
			len(attempts), len(grants))
		return nil
	}
	db, err := openAuditDB(inv.cfg)
	if err != nil {
		return exitError{code: 2, err: err}
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	uses, err := approval.GrantUses(ctx, database.SQL(db), grants)
	if err != nil {
		return exitError{code: 2, err: err}
	}
	problems, foreign := compareGrantUses(attempts, uses)
	return printGrantCheck(inv.stdout, path, len(attempts), len(grants), problems, foreign)
}

func grantIDs(attempts []agent.GrantAttempt) []string {
	set := map[string]bool{}
	for _, a := range attempts {
		set[a.GrantID] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// compareGrantUses checks each journal attempt sent under a grant against the grants' `used` records: an attempt
// the service answered as the first of its operation (2xx or 202, not replayed) used its grant, by that
// operation; one refused grant_invalid used nothing; one without an answer may have either. foreign counts the
// uses by attempts this journal does not hold (another journal of the same agent key).
func compareGrantUses(attempts []agent.GrantAttempt, uses []approval.GrantUse) (problems []string, foreign int) {
	type ref struct{ grant, attempt string }
	used := map[ref]approval.GrantUse{}
	for _, u := range uses {
		used[ref{u.GrantID, u.AttemptID}] = u
	}
	seen := map[ref]bool{}
	for _, a := range attempts {
		k := ref{a.GrantID, a.AttemptID}
		seen[k] = true
		u, ok := used[k]
		first := a.Status >= 200 && a.Status < 300 && !a.Replayed
		switch {
		case first && !ok:
			problems = append(problems, fmt.Sprintf("action %q attempt %s: answered %d under grant %s, and the grant has no use by it",
				a.ActionID, a.AttemptID, a.Status, a.GrantID))
		case ok && a.ServerOperationID != "" && u.OperationID != a.ServerOperationID:
			problems = append(problems, fmt.Sprintf("action %q attempt %s: grant %s records its use by operation %s; the journal says %s",
				a.ActionID, a.AttemptID, a.GrantID, u.OperationID, a.ServerOperationID))
		case ok && a.Code == agent.CodeGrantInvalid:
			problems = append(problems, fmt.Sprintf("action %q attempt %s: refused grant_invalid, yet grant %s records a use by it",
				a.ActionID, a.AttemptID, a.GrantID))
		}
	}
	for _, u := range uses {
		if !seen[ref{u.GrantID, u.AttemptID}] {
			foreign++
		}
	}
	return problems, foreign
}

func printGrantCheck(w io.Writer, path string, attempts, grants int, problems []string, foreign int) error {
	fmt.Fprintf(w, "checked grants of journal %s: %d attempts under %d grants against the service's records\n", path, attempts, grants)
	if foreign > 0 {
		fmt.Fprintf(w, "note: %d uses of these grants by attempts of other journals\n", foreign)
	}
	if len(problems) == 0 {
		fmt.Fprintln(w, "GRANTS CONSISTENT")
		return nil
	}
	for _, p := range problems {
		fmt.Fprintf(w, "BROKEN %s\n", agent.Printable(p))
	}
	return exitError{code: 1, err: fmt.Errorf("audit verify: journal %s: %d grant records disagree", path, len(problems))}
}
