package opstore

// The vocabulary of the records: the types of the events the library writes, and the fixed lists their reasons
// come from. A record carries only these; an error's own words go to the log.

// Event types written by retrysafe. Services may add their own.
const (
	EventClaimed          = "claimed"
	EventCompleted        = "completed"
	EventReplayed         = "replayed"
	EventRetried          = "retried" // a retry answered from the operation's state: still running, or unknown
	EventConflictRejected = "conflict_rejected"
	EventFailed           = "failed"
	EventStateChanged     = "state_changed"
	EventLeaseExpired     = "lease_expired"
	EventReconciled       = "reconciled"
	EventOutcomeUnknown   = "outcome_unknown" // an effect's call ended without a definite answer
	EventAttemptRefused   = "attempt_refused" // a retry refused after its key was found (an unknown Retry-Of)
	EventSuperseded       = "superseded"      // a later operation of the account replaces this one's intent
	// EventDispatchStarted is committed before a call that leaves the process is written; one of the
	// Dispatch* events follows with what the caller observed.
	EventDispatchStarted          = "dispatch_started"
	EventDispatchNotSent          = "dispatch_not_sent"          // no connection: nothing reached the other side
	EventDispatchResponseReceived = "dispatch_response_received" // an answer came back, whatever it said
	EventDispatchSentNoResponse   = "dispatch_sent_no_response"  // sent, no usable answer: it may have happened
	EventDispatchExecutionError   = "dispatch_execution_error"   // the call could not be carried out (see its reason)
)

// Dispatch reasons: the fixed list the reason of a dispatch_* record comes from, for every downstream (the
// payment provider's client, the deploy controller's target calls). A call's error text goes to the log, never
// to a record.
const (
	// not_sent: no connection was established, so nothing reached the other side (cancelled: the call was
	// given up before; evidence_not_recorded: dispatch_started could not be written, so the call was not made).
	ReasonConnectionRefused   = "connection_refused"
	ReasonDNSFailure          = "dns_failure"
	ReasonTLSFailure          = "tls_failure"
	ReasonConnectTimeout      = "connect_timeout"
	ReasonConnectFailed       = "connect_failed"
	ReasonCancelled           = "cancelled"
	ReasonEvidenceNotRecorded = "evidence_not_recorded"
	// sent_no_response: the request went out and no usable answer came back (also cancelled, after the write).
	ReasonTimeout          = "timeout"
	ReasonConnectionReset  = "connection_reset"
	ReasonConnectionClosed = "connection_closed"
	ReasonNoResponse       = "no_response"
	ReasonResponseCut      = "response_cut"
	// ReasonTargetError: the deploy target's call failed in a way that does not say whether it activated.
	ReasonTargetError = "target_error"
	// execution_error: the call could not be carried out. ReasonRequestNotBuilt: this process could not build
	// the request, nothing was sent; ReasonActivationFailed: the deploy target answered that it could not
	// activate the deploy.
	ReasonRequestNotBuilt  = "request_not_built"
	ReasonActivationFailed = "activation_failed"
	// response_received, with an answer this process could not use.
	ReasonResponseNotUnderstood = "response_not_understood"
)

// Reasons an operation's outcome became unknown: the reason of its outcome_unknown event. Records carry only
// these; the underlying error goes to the log.
const (
	// ReasonNoDefiniteAnswer: the effect's call ended without an answer that settles it (a timeout, a
	// dropped connection): it may or may not have happened.
	ReasonNoDefiniteAnswer = "no_definite_answer"
	// ReasonLeaseExpired: the process that claimed it stopped before recording an outcome (it crashed, or
	// outlived its lease); the recovery worker writes the claiming attempt's record with outcome unknown.
	ReasonLeaseExpired = "lease_expired"
)

// Reasons a reconciler settled an operation (the reason of its reconciled event) besides the problem code of a
// stored failure (provider_unavailable, provider_declined, duplicate_effect_confirmed, ...).
const (
	// ReasonRemoteRecordFound: the other side's record of the operation (a provider's stored answer, a deploy
	// target's marker) shows the effect happened.
	ReasonRemoteRecordFound = "remote_record_found"
	// ReasonRemoteRecordAbsent: the other side has no record, and our call can no longer arrive.
	ReasonRemoteRecordAbsent = "remote_record_absent"
)

// Reasons an operation failed before its effect was attempted (the reason of its failed event).
const (
	// ReasonQueueTimeout: the operation waited in its queue longer than the queue allows and was given up, its
	// effect never started.
	ReasonQueueTimeout = "queue_timeout"
)

// EventOperatorDecision records a person's decision on an operation whose outcome was unknown: who (its
// actor), when (its time), the state decided and the evidence it rests on. It is also the operation's move to
// that state.
const EventOperatorDecision = "operator_decision"
