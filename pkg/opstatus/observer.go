package opstatus

// Observer learns what happens to operations, for metrics. Its methods are called after the fact (after the
// commit that moved an operation), must be cheap and safe for concurrent use, and must not block. Every field
// of type Observer in retrysafe may be nil, which means nobody is told.
type Observer interface {
	// OperationFinished is called once an operation of kind committed a move to a final state.
	OperationFinished(kind string, state State)
	// Reconciled is called after a reconciler was asked to settle an unknown operation of kind.
	Reconciled(kind string, result ReconcileResult)
}

// ReconcileResult is what asking a reconciler achieved.
type ReconcileResult string

const (
	// ReconcileSettled: the operation left the unknown state.
	ReconcileSettled ReconcileResult = "settled"
	// ReconcileStillUnknown: the reconciler returned without error but the operation is still unknown.
	ReconcileStillUnknown ReconcileResult = "still_unknown"
	// ReconcileError: the reconciler could not settle it yet (the other side unreachable or unable to tell);
	// it is asked again later.
	ReconcileError ReconcileResult = "error"
)

// ObserveFinished tells o, when o is not nil, that an operation of kind moved to state, if state is final.
func ObserveFinished(o Observer, kind string, state State) {
	if o != nil && state.Final() {
		o.OperationFinished(kind, state)
	}
}

// observeReconciled tells o, when o is not nil, what asking the reconciler of kind achieved.
func observeReconciled(o Observer, kind string, result ReconcileResult) {
	if o != nil {
		o.Reconciled(kind, result)
	}
}
