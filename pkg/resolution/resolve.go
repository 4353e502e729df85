package resolution

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Resolver carries a person's decision on an unknown operation of one kind into the service's own rows: it
// releases what the operation held (a payment's reservation, a deploy's environment lock) and records the
// effect decided, in tx, the transaction that records the decision. It leaves the operation's own state to
// Resolve. An error rolls the decision back; a
// *problem.Error reaches the caller (a decision the service cannot record, such as a succeeded authorization
// without the provider's remote_ref).
type Resolver interface {
	Resolve(ctx context.Context, tx *gorm.DB, op opstatus.Operation, d opstatus.Decision) error
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, d opstatus.Decision) error

func (f ResolverFunc) Resolve(ctx context.Context, tx *gorm.DB, op opstatus.Operation, d opstatus.Decision) error {
	return f(ctx, tx, op, d)
}

// Resolve records actor's decision d on operation id of account, in tx: it locks the operation, refuses one
// that is not unknown (409 invalid_state naming its state) and one whose call may still arrive at the other side
// (opstatus.CallMayLand: 409 call_may_still_land with Retry-After), lets the Resolver of its kind release what the
// operation held, and moves the operation to d.State with an operator_decision event. d must be valid
// (opstatus.Decision.Validate). Returns problem.ErrNotFound for another account's operation.
//
// resolvers are the Resolvers of the process by kind, services the names of the services it runs. A kind names
// its service before its first dot (payments.capture). A kind without a Resolver holds nothing when the process
// runs its service; when it does not, the decision is refused (409 resolver_elsewhere naming the service): only
// that service can release what the operation holds, and settling the operation without it would strand it.
func Resolve(ctx context.Context, tx *gorm.DB, accountID, id, actor string, d opstatus.Decision, resolvers map[string]Resolver, services []string) (opstatus.Operation, error) {
	db := database.SQL(tx)
	op, err := opstatus.LockForDecision(ctx, db, accountID, id)
	if err != nil {
		return opstatus.Operation{}, err
	}
	if op.State != opstatus.StateUnknown {
		return opstatus.Operation{}, problem.New("invalid_state",
			"operation %s is %s; only an operation whose outcome is unknown takes a person's decision", id, op.State).
			With("state", op.State).With("operation_id", id)
	}
	r, ok := resolvers[op.Kind]
	if service, _, _ := strings.Cut(op.Kind, "."); !ok && !slices.Contains(services, service) {
		return opstatus.Operation{}, problem.New("resolver_elsewhere",
			"operation %s is a %s operation, which this process does not run: send the decision to the %s service; nothing was decided",
			id, op.Kind, service).With("operation_id", id).With("kind", op.Kind).With("service", service)
	}
	now := time.Now()
	if until, _, err := opstatus.CallMayLand(ctx, db, op, now); err != nil {
		return opstatus.Operation{}, err
	} else if !until.IsZero() {
		return opstatus.Operation{}, opstatus.CallMayLandProblem(op, until, now)
	}
	if ok {
		if err := r.Resolve(ctx, tx, op, d); err != nil {
			return opstatus.Operation{}, err
		}
	}
	moved, err := opstatus.Transition(ctx, db, accountID, id, d.State, actor, opstatus.From(opstatus.StateUnknown),
		opstatus.WithLease(time.Time{}), opstatus.WithEvent(opstore.EventOperatorDecision, d))
	if err != nil {
		return opstatus.Operation{}, err
	}
	if !moved {
		return opstatus.Operation{}, fmt.Errorf("resolution: resolve %s: the operation left the unknown state under its lock", id)
	}
	return opstatus.Get(ctx, db, accountID, id)
}
