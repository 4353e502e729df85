package opstatus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// callOver reads the operation's own dispatch records and returns the record that shows its call to the other
// side is over, or "" when the call may still be in flight: dispatch_response_received (an answer came back,
// whatever its status) or dispatch_not_sent (nothing left the process) as the newest dispatch record. A
// dispatch_started with nothing after it, a dispatch_sent_no_response, or no record at all (the finish could
// not be written) leave the call possibly in flight: only the lease bounds it then.
func callOver(ctx context.Context, db database.DBTX, accountID, id string) (string, error) {
	last, err := opstore.LastDispatch(ctx, db, accountID, id)
	if err != nil {
		return "", err
	}
	if last == opstore.EventDispatchResponseReceived || last == opstore.EventDispatchNotSent {
		return last, nil
	}
	return "", nil
}

// CallMayLand reports whether the call op sent to the other side may still arrive there at now, and so whether
// its outcome may be concluded from the other side's silence or decided by a person yet. It cannot once its
// dispatch records show it over (callOver; reason is that record) or once the lease that bounds every call of
// the operation has ended (reason opstore.ReasonLeaseExpired; an operation without a lease has no call that can still
// run). While it may, until is the end of the lease and reason is "". It is the one test of this in retrysafe:
// reconcilers that read the other side's silence and every person's decision (Resolve) ask it.
func CallMayLand(ctx context.Context, db database.DBTX, op Operation, now time.Time) (until time.Time, reason string, err error) {
	over, err := callOver(ctx, db, op.AccountID, op.ID)
	switch {
	case err != nil:
		return time.Time{}, "", err
	case over != "":
		return time.Time{}, over, nil
	case op.LeaseExpiresAt == nil || !now.Before(*op.LeaseExpiresAt):
		return time.Time{}, opstore.ReasonLeaseExpired, nil
	}
	return *op.LeaseExpiresAt, "", nil
}

// CallMayLandProblem is the refusal of a decision on op while its call may still arrive (CallMayLand): 409
// call_may_still_land, with Retry-After the seconds until the lease that bounds the call ends.
func CallMayLandProblem(op Operation, until, now time.Time) *problem.Error {
	p := problem.New("call_may_still_land",
		"operation %s may still have its call arrive at the other side until %s; nothing was decided: decide once it cannot, when the reconciler may well have settled it",
		op.ID, until.UTC().Format(time.RFC3339)).
		With("operation_id", op.ID).With("state", op.State).With("lease_expires_at", until.UTC())
	p.RetryAfter = max(1, int((until.Sub(now)+time.Second-1)/time.Second))
	return p
}

// errNotRunning is StartDispatch's refusal: the operation is no longer running (settled, marked unknown, or its
// claim released because its owner is gone), so its call must not be sent.
var errNotRunning = errors.New("opstatus: the operation is not running")

// StartDispatch commits the dispatch_started record of a call that leaves the process, before the call is
// written, or returns an error matching errNotRunning when the operation is no longer running: the caller must
// then not send it (provider.DispatchObserver.Started's contract).
func StartDispatch(ctx context.Context, db database.DBTX, accountID, id, actor string, detail any) error {
	started, err := opstore.StartDispatch(ctx, db, accountID, id, opstore.NewEvent{Type: opstore.EventDispatchStarted, Actor: actor, Detail: detail})
	if err != nil {
		return err
	}
	if !started {
		return fmt.Errorf("opstatus: dispatch of %s: %w", id, errNotRunning)
	}
	return nil
}
