package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/retrysafe/retrysafe/pkg/agent"
)

// An agent makes a write under a name it chose for the intended action. If the process dies anywhere, a new
// one opens the same journal, resumes, and calls again with the same name: the journal still has the
// operation and its idempotency key, so the ticket is created once.
func Example() {
	a, err := agent.Open("agent.journal", agent.Config{
		TicketsURL:   "http://127.0.0.1:8081",
		APIKey:       os.Getenv("AGENT_API_KEY"), // used for requests, never written to the journal
		AuthorityRef: "env:AGENT_API_KEY",
	})
	if err != nil {
		log.Fatal(err) // agent.ErrJournalLocked: another agent holds this journal
	}
	defer a.Close()

	ctx := context.Background()
	if _, err := a.Resume(ctx); err != nil { // settle whatever a previous run left unfinished
		log.Fatal(err)
	}
	res, err := a.Do(ctx, "alert-7c91-ticket", "create_ticket",
		json.RawMessage(`{"project":"ops","title":"Rotate staging certificate","priority":"high"}`), agent.DoOptions{})
	switch {
	case errors.Is(err, agent.ErrChangedIntent):
		// Same action id, other arguments: nothing was sent. A new intent needs a new action id, with
		// DoOptions{Supersedes: "alert-7c91-ticket"}.
		log.Fatal(err)
	case err != nil:
		log.Fatal(err) // the context ended or the journal failed: call again with the same action id
	}
	switch res.State {
	case agent.StateSucceeded:
		fmt.Println("created:", string(res.Body))
	case agent.StateNeedsHuman, agent.StateInProgress:
		fmt.Println("waiting:", res.NextStep) // e.g. an approval to request, or evidence for a person
	default: // refused, failed
		fmt.Println(res.State, res.Code, res.NextStep)
	}
}
