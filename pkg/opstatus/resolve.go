package opstatus

import (
	"context"
	"errors"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// maxEvidence is the most characters a decision's evidence may hold; maxRemoteRef those of its remote_ref.
const (
	maxEvidence  = 2000
	maxRemoteRef = 255
)

// Decision is what a person decided about an unknown operation, from evidence outside retrysafe (the
// provider's dashboard, a call to the bank, the deploy target's logs).
type Decision struct {
	// State is StateSucceeded or StateFailed.
	State State `json:"state"`
	// Evidence says what the decision rests on, in the person's words (several lines allowed).
	Evidence string `json:"evidence"`
	// RemoteRef names the other side's record of the effect (a provider's refund id), when there is one.
	RemoteRef string `json:"remote_ref,omitempty"`
}

// Validate holds d to the input rules: 422 validation_failed naming each bad field.
func (d Decision) Validate() error {
	var errs []problem.FieldError
	if d.State != StateSucceeded && d.State != StateFailed {
		errs = append(errs, problem.FieldError{Field: "state", Message: "must be succeeded or failed"})
	}
	errs = problem.CheckMultilineText(errs, "evidence", d.Evidence, maxEvidence, true)
	errs = problem.CheckText(errs, "remote_ref", d.RemoteRef, maxRemoteRef, false)
	if len(errs) > 0 {
		return problem.Validation(errs...)
	}
	return nil
}

// LockForDecision locks operation id of account for a person's decision, as Transition locks it: the decision
// and a reconciler settling the same operation wait for each other, and the second finds it no longer unknown.
// Returns problem.ErrNotFound for another account's operation.
func LockForDecision(ctx context.Context, tx database.DBTX, accountID, id string) (Operation, error) {
	row, err := opstore.LockForDecision(ctx, tx, accountID, id)
	if errors.Is(err, opstore.ErrNotFound) {
		return Operation{}, problem.NotFound("operation")
	}
	if err != nil {
		return Operation{}, err
	}
	return operation(row), nil
}
