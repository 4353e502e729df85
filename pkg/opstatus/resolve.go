package opstatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

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

// Resolver carries a person's decision on an unknown operation of one kind into the service's own rows: it
// releases what the operation held (a payment's reservation, a deploy's environment lock) and records the
// effect decided, in tx, the transaction that records the decision. It leaves the operation's own state to
// Resolve. An error rolls the decision back; a
// *problem.Error reaches the caller (a decision the service cannot record, such as a succeeded authorization
// without the provider's remote_ref).
type Resolver interface {
	Resolve(ctx context.Context, tx *gorm.DB, op Operation, d Decision) error
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, tx *gorm.DB, op Operation, d Decision) error

func (f ResolverFunc) Resolve(ctx context.Context, tx *gorm.DB, op Operation, d Decision) error {
	return f(ctx, tx, op, d)
}

// Resolve records actor's decision d on operation id of account, in tx: it locks the operation, refuses one
// that is not unknown (409 invalid_state naming its state) and one whose call may still arrive at the other side
// (CallMayLand: 409 call_may_still_land with Retry-After), lets the Resolver of its kind release what the
// operation held, and moves the operation to d.State with an operator_decision event. d must be valid
// (Decision.Validate). Returns problem.ErrNotFound for another account's operation.
//
// resolvers are the Resolvers of the process by kind, services the names of the services it runs. A kind names
// its service before its first dot (payments.capture). A kind without a Resolver holds nothing when the process
// runs its service; when it does not, the decision is refused (409 resolver_elsewhere naming the service): only
// that service can release what the operation holds, and settling the operation without it would strand it.
func Resolve(ctx context.Context, tx *gorm.DB, accountID, id, actor string, d Decision, resolvers map[string]Resolver, services []string) (Operation, error) {
	// Locked as Transition locks it: the decision and a reconciler settling the same operation wait for each
	// other, and the second finds it no longer unknown.
	row, err := opstore.LockForDecision(ctx, database.SQL(tx), accountID, id)
	if errors.Is(err, opstore.ErrNotFound) {
		return Operation{}, problem.NotFound("operation")
	}
	if err != nil {
		return Operation{}, err
	}
	op := operation(row)
	if op.State != StateUnknown {
		return Operation{}, problem.New("invalid_state",
			"operation %s is %s; only an operation whose outcome is unknown takes a person's decision", id, op.State).
			With("state", op.State).With("operation_id", id)
	}
	r, ok := resolvers[op.Kind]
	if service, _, _ := strings.Cut(op.Kind, "."); !ok && !slices.Contains(services, service) {
		return Operation{}, problem.New("resolver_elsewhere",
			"operation %s is a %s operation, which this process does not run: send the decision to the %s service; nothing was decided",
			id, op.Kind, service).With("operation_id", id).With("kind", op.Kind).With("service", service)
	}
	now := time.Now()
	if until, _, err := CallMayLand(ctx, tx, op, now); err != nil {
		return Operation{}, err
	} else if !until.IsZero() {
		return Operation{}, CallMayLandProblem(op, until, now)
	}
	if ok {
		if err := r.Resolve(ctx, tx, op, d); err != nil {
			return Operation{}, err
		}
	}
	moved, err := Transition(ctx, tx, accountID, id, d.State, actor, From(StateUnknown), WithLease(time.Time{}),
		WithEvent(opstore.EventOperatorDecision, d))
	if err != nil {
		return Operation{}, err
	}
	if !moved {
		return Operation{}, fmt.Errorf("opstatus: resolve %s: the operation left the unknown state under its lock", id)
	}
	return Get(ctx, tx, accountID, id)
}
