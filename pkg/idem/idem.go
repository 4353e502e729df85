package idem

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/batch"
	"github.com/retrysafe/retrysafe/pkg/clock"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/pkg/tracing"
)

// Failpoints of idem (package failpoint), for crash tests. Those marked "op" are hit with the operation.
const (
	failpointAfterClaim         = "idem.after_claim"          // after a local claim is queued, before the write
	failpointBeforeCommit       = "idem.before_commit"        // op; before a local write's commit
	failpointExternalClaimed    = "idem.external.claimed"     // op; before an external claim's commit, after Prepare
	failpointBeforeExternalCall = "idem.external.before_call" // op; just before an external call
	failpointAfterExternalCall  = "idem.external.after_call"  // just after an external call
)

// Response headers of the contract. HeaderKeyAbsent says that a write ran without an Idempotency-Key
// (Handler.KeyOptional): a retry of it may run it again.
const (
	headerReplayed    = "Idempotent-Replayed"
	headerOperationID = "Operation-Id"
	headerKeyAbsent   = "Idempotency-Key-Absent"
)

// Request describes one idempotent write.
type Request struct {
	// Kind names the operation, "<service>.<action>": tickets.create, payments.capture, ...
	Kind string
	// Command is the validated command, with defaults applied; its canonical JSON is part of the fingerprint.
	Command any
	// Guard, when set, runs right after a new claim, in the claim's transaction, before any effect: approvals
	// hook in here, so a replay of an approved request needs no new approval. An error rolls the claim back.
	Guard func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, fingerprint string) error
	// SupersedeUnknown, when set, is asked in the claim's transaction whether this write may supersede an
	// operation whose outcome is unknown (Supersedes-Operation-Id): true when a person approved this exact
	// request, shown that operation (package approval). Unset or false, the write is refused 409
	// superseded_operation_unknown; an error refuses it with that error.
	SupersedeUnknown func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, fingerprint, supersedes string) (bool, error)
	// Takes names the headers of those only some writes take (HeaderApprovalID, HeaderRemediates) that this one
	// reads. A request carrying another of them is refused before its key is read.
	Takes []string
}

// Result is the answer to store and send.
type Result struct {
	Status int
	// Body is marshalled to JSON once; the same bytes are sent and stored.
	Body any
	// Header may carry Location and Retry-After; other names are not stored.
	Header http.Header
	// Resource names what the operation created or acted on.
	Resource *opstatus.Resource
	// State is the operation's state once the result is stored: succeeded when empty. A write that hands work
	// to a background worker (a queued deploy) says queued.
	State opstatus.State
	// Reason says, from a fixed list, why the operation ended the way it did: ProblemResult sets the problem's
	// code. It goes into the completion event, never an error's text.
	Reason string
}

// WriteFunc does a local write inside tx, the transaction that holds the claim, whatever tx's gorm
// configuration (its default transaction does not start; a nested Transaction is a savepoint). op is the
// operation the write's outcome will be stored on: its row is inserted after the write returns, in tx.
type WriteFunc func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (Result, error)

// Handler runs idempotent writes. Build it with New; the fields other than DB have defaults.
type Handler struct {
	// DB is the pool (gorm on PostgreSQL through pgx: gorm.io/driver/postgres or database.Open), migrated with
	// the library's migrations.
	DB *gorm.DB
	// Logger is slog.Default() when nil.
	Logger *slog.Logger
	// Lease is how long an external effect may run before the recovery worker calls its outcome unknown,
	// counted from the claim's commit. It must be longer than the effect's own timeout (30 s when zero).
	Lease time.Duration
	// DispatchMargin is the least lease an external effect must have left when its claim commits to be sent
	// at all; with less the claim is released unsent. Give it the effect's own timeout (Lease/4 when zero).
	DispatchMargin time.Duration
	// RetryAfter is the Retry-After, in seconds, of a 409 request_in_progress (1 when zero).
	RetryAfter int
	// MaxWait caps Prefer: wait=N (30 s when zero); MaxWaiters bounds the requests waiting at once (64 when
	// zero), and one more is answered without waiting.
	MaxWait    time.Duration
	MaxWaiters int
	// Retention is how long a stored response is replayed (DefaultRetention when zero); KeyLifetime how long
	// the key itself, with its fingerprint and operation, is kept after (DefaultKeyLifetime when zero, never less
	// than Retention). While the key lives it never runs again. Prune (and RunBackground, every PruneInterval) applies both.
	Retention   time.Duration
	KeyLifetime time.Duration
	// Reconcilers, by operation kind, let a retry of an unknown operation settle it at once (reconcileNow).
	Reconcilers map[string]opstatus.Reconciler
	// Observer, when set, is told each request's outcome and each operation the handler settles (metrics).
	Observer Observer
	// KeyOptional lets a write without an Idempotency-Key run, unprotected, under a key the server makes up:
	// its answer says so (Idempotency-Key-Absent: true) and it is counted as OutcomeUnkeyed. A migration path
	// for APIs whose clients send no keys yet; off by default (400 idempotency_key_missing).
	KeyOptional bool
	// Owner, when set, marks this process's external claims (opstatus.HoldOwner), so a same-key retry releases
	// a claim whose process is gone before its call started instead of waiting for its lease (releaseOrphan).
	Owner *opstatus.Owner
	// Clock is the time leases and pruning count by: the real time when nil. A test moves it instead of sleeping
	// through a lease or a retention; RunBackground's recovery worker shares it.
	Clock *clock.Clock

	// What requests share, made by init on first use (a Handler may be a literal): the appender of attempt
	// records, so concurrent retries' records share commits; the key reads, so concurrent requests' reads share
	// a round trip; and the MaxWaiters places to wait.
	once     sync.Once
	attempts *opstore.GroupAppender
	lookups  *batch.Batcher[keyRef, lookup]
	waiters  chan struct{}
	// background is whether RunBackground runs; backgroundWarned, that its absence was told.
	background       atomic.Bool
	backgroundWarned sync.Once
	// resourceWarned holds the kinds whose success stored no Resource and was told once (warnNoResource).
	resourceWarned sync.Map
}

// New returns a Handler on db, or an error that says what to do when db is not a pool the library can use
// (database.Check): another driver, or a transaction instead of the pool; or when RETRYSAFE_FAILPOINTS, which
// New reads for crash tests (failpoint.FromEnvironment), does not parse.
func New(db *gorm.DB) (*Handler, error) {
	if err := database.Check(db); err != nil {
		return nil, fmt.Errorf("idem: %w", err)
	}
	// A crash test stops the service at its claim through the environment alone (failpoint.FromEnvironment).
	if err := failpoint.FromEnvironment(); err != nil {
		return nil, fmt.Errorf("idem: %w", err)
	}
	return &Handler{DB: db}, nil
}

func (h *Handler) init() {
	h.once.Do(func() {
		h.attempts = &opstore.GroupAppender{DB: database.SQL(h.DB)}
		h.lookups = &batch.Batcher[keyRef, lookup]{Run: func(ctx context.Context, refs []keyRef) ([]lookup, error) {
			return lookupKeys(ctx, h.DB, refs)
		}}
		n := positiveOr(h.MaxWaiters, 64)
		h.waiters = make(chan struct{}, n)
		for range n {
			h.waiters <- struct{}{}
		}
	})
}

// readKey reads a request's key, before its claim and after a claim that found it taken. The reads of concurrent
// requests go together in one round trip (package batch): copies of one request arriving together (a storm)
// read their key once. docs/benchmarks.md has what it is worth.
func (h *Handler) readKey(ctx context.Context, account, key string) (stored, bool, error) {
	h.init()
	l, err := h.lookups.Do(ctx, account+"\x00"+key, keyRef{account, key})
	return l.stored, l.found, err
}

// The settings with their defaults. A key outlives its response: its lifetime is never shorter than the
// retention.
func (h *Handler) log() *slog.Logger             { return cmp.Or(h.Logger, slog.Default()) }
func (h *Handler) lease() time.Duration          { return positiveOr(h.Lease, 30*time.Second) }
func (h *Handler) dispatchMargin() time.Duration { return positiveOr(h.DispatchMargin, h.lease()/4) }
func (h *Handler) retention() time.Duration      { return positiveOr(h.Retention, defaultRetention) }
func (h *Handler) keyLifetime() time.Duration {
	return max(positiveOr(h.KeyLifetime, defaultKeyLifetime), h.retention())
}

// positiveOr is v, or def for a setting left zero (or negative).
func positiveOr[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// Caller is who sends a write: the account its keys and operations belong to, and how records name it.
type Caller struct {
	AccountID string
	Actor     string
}

// Call is one HTTP request as the core needs it; the adapters (package idemgin, HTTPCall) build it.
type Call struct {
	Method string
	// Route is the route template ("/v1/tickets/{id}" or gin's "/v1/tickets/:id"); Params its path parameters.
	// Both are part of the fingerprint: one key used on two resources is a conflict, not a replay.
	Route  string
	Params map[string]string
	Header http.Header
	Caller Caller
	// AttemptID names this HTTP attempt (the Attempt-Id header, or one the server made); see lineage.go.
	AttemptID string
}

// Answer is what to send back: a response, or Err, a problem to render (problem.Write) with
// Header's headers.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
	Err    error
}

// attempt is one request being decided: its key, fingerprint and lineage, and the operation a claim would start.
type attempt struct {
	key         string
	fingerprint string
	caller      Caller
	lineage     lineage
	op          opstatus.Operation
	// external: the claim commits before the effect (RunExternal), with a claimed event of its own; a local
	// write's one event records its claim and its outcome together.
	external bool
	// attemptRecorded: the claiming attempt already has its attempt record (the recovery worker wrote it
	// when the lease ran out), so the completion does not number it again.
	attemptRecorded bool
	// owner: the Handler's Owner id when an external claim is made, marked on its claimed event (0: none).
	owner int64
}

// start checks the request (its caller, key and lineage headers), computes its fingerprint and reads its key: a
// request that is refused, or whose key exists, is answered here; otherwise it goes on to claim the key. A
// failed read goes on too: the claim reports the failure. reclaim, when set, may free an existing key for this
// request (an external claim whose owner is gone, releaseOrphan), which then goes on to claim it.
func (h *Handler) start(ctx context.Context, call Call, req Request, reclaim func(*attempt, stored) bool) (*attempt, *Answer) {
	h.checkBackground()
	refuse := func(err error) (*attempt, *Answer) {
		h.observe(req.Kind, outcomeRefused)
		return nil, &Answer{Err: err}
	}
	if call.Caller.AccountID == "" {
		h.log().Error("idem: a write reached the handler with no caller: authenticate before it (Call.Caller, idemgin with auth, or WithCaller)", "kind", req.Kind)
		return refuse(problem.New("internal", "the server could not tell who sent this request"))
	}
	values := call.Header.Values(headerKey)
	key, err := ParseKey(call.Header.Get(headerKey), len(values) > 0)
	if h.unkeyed(call) {
		key, err = ids.New("unkeyed_"), nil
	}
	if err == nil && len(values) > 1 {
		err = problem.New("idempotency_key_invalid", "send exactly one Idempotency-Key header")
	}
	if err != nil {
		return refuse(err)
	}
	fp, err := Fingerprint(call.Method, call.Route, call.Params, call.Caller.AccountID, req.Command)
	if err != nil {
		return refuse(err)
	}
	lin, err := parseLineage(call.Header, call.AttemptID)
	if err == nil {
		err = checkTakes(call.Header, req.Takes)
	}
	if err != nil {
		return refuse(err)
	}
	a := &attempt{key: key, fingerprint: fp, caller: call.Caller, lineage: lin, op: opstatus.Operation{
		ID: opstatus.NewID(), AccountID: call.Caller.AccountID, Kind: req.Kind, State: opstatus.StateRunning,
		IdempotencyKey: key, Fingerprint: fp,
	}}
	if s, found, err := h.readKey(ctx, a.op.AccountID, key); err == nil && found && (reclaim == nil || !reclaim(a, s)) {
		ans := h.existing(ctx, a, s, call.Header)
		return nil, &ans
	}
	return a, nil
}

// Run runs write once for the request's Idempotency-Key, in local mode: the claim, the write and the stored
// response commit in one transaction; if write returns an error nothing is stored and the key stays free. The
// answer is the new result, the stored one, or a problem.
func (h *Handler) Run(ctx context.Context, call Call, req Request, write WriteFunc) Answer {
	return h.markUnkeyed(call, h.run(ctx, call, req, write))
}

func (h *Handler) run(ctx context.Context, call Call, req Request, write WriteFunc) Answer {
	a, done := h.start(ctx, call, req, nil)
	if done != nil {
		return *done
	}
	// Once begun, the write is not cut short by the caller hanging up: it commits or rolls back whole, bounded
	// by the statement timeout, and a retry with the same key learns which.
	ctx = context.WithoutCancel(ctx)
	resp, err := h.runLocal(ctx, a, req, write)
	var lost commitLost
	switch {
	case keyTaken(err):
		return h.taken(ctx, a, call.Header)
	case errors.As(err, &lost):
		// The connection went away during COMMIT: the write may have committed. Only the same key can tell.
		h.observe(req.Kind, outcomeUnknown)
		return Answer{Err: problem.OutcomeUnknown(a.op.ID, lost.err)}
	case err != nil:
		return h.fail(req.Kind, err)
	}
	h.observe(req.Kind, h.created(call))
	opstatus.ObserveFinished(h.OperationObserver(), req.Kind, a.op.State)
	return answer(a.op.ID, resp, false)
}

// unkeyed reports whether call runs without idempotency: it has no key and the handler lets it.
func (h *Handler) unkeyed(call Call) bool {
	return h.KeyOptional && len(call.Header.Values(headerKey)) == 0
}

// markUnkeyed adds HeaderKeyAbsent to the answer of a call that ran unkeyed.
func (h *Handler) markUnkeyed(call Call, ans Answer) Answer {
	if h.unkeyed(call) {
		if ans.Header == nil {
			ans.Header = http.Header{}
		}
		ans.Header.Set(headerKeyAbsent, "true")
	}
	return ans
}

// created is the outcome of a call that claimed its key and ran.
func (h *Handler) created(call Call) Outcome {
	if h.unkeyed(call) {
		return outcomeUnkeyed
	}
	return outcomeCreated
}

// commitLost is a COMMIT whose answer did not come back: the transaction may have committed.
type commitLost struct{ err error }

func (c commitLost) Error() string { return "idem: commit lost: " + c.err.Error() }

// runLocal is Run's transaction: claim, write, completion. BEGIN goes with the claim and COMMIT with the
// completion (database.Tx). The operation is written once, at completion, with one event that records its
// claim too.
func (h *Handler) runLocal(ctx context.Context, a *attempt, req Request, write WriteFunc) (response, error) {
	tx, err := database.Begin(ctx, h.DB)
	if err != nil {
		return response{}, err
	}
	defer tx.Close()
	if err := traced(ctx, "idem.claim", a, func(ctx context.Context) error { return h.claim(ctx, tx, a, req) }); err != nil {
		return response{}, err
	}
	failpoint.Hit(failpointAfterClaim)
	var res Result
	if err := traced(ctx, "idem.write", a, func(ctx context.Context) (err error) {
		res, err = write(ctx, tx.Gorm(), a.op)
		return err
	}); err != nil {
		return response{}, err
	}
	resp, b, err := h.completion(a, res, opstore.EventCompleted)
	if err != nil {
		return response{}, err
	}
	failpoint.Hit(failpointBeforeCommit, a.op)
	if err := traced(ctx, "idem.complete", a, func(ctx context.Context) error { return tx.Commit(ctx, b) }); problem.IsStoreUnavailable(err) {
		return response{}, commitLost{err}
	} else if err != nil {
		return response{}, err
	}
	return resp, nil
}

// traced runs step in a span named name (pkg/tracing; nothing when tracing is off), marked with a's operation.
func traced(ctx context.Context, name string, a *attempt, step func(context.Context) error) error {
	if !tracing.Enabled() {
		return step(ctx)
	}
	ctx, span := tracing.Start(ctx, name, attribute.String("retrysafe.operation_id", a.op.ID), attribute.String("retrysafe.kind", a.op.Kind))
	defer span.End()
	err := step(ctx)
	if err != nil {
		span.SetStatus(codes.Error, "failed")
	}
	return err
}

// claim takes a's key in tx, then checks the lineage headers and runs the Guard. An external claim inserts its
// operation running, with its claimed event, to commit before the effect. A local claim takes the key's lock
// (opstore.QueueKeyFree) and reads the key again under it, in the transaction's next round trip (Tx.Queue): with
// the write's first statement when the write sends it through database.Query, else just before it; its
// operation is inserted once, completed, with the write's outcome (completion). A key another operation holds
// fails it (keyTaken), and with it whatever statement carried it.
func (h *Handler) claim(ctx context.Context, tx *database.Tx, a *attempt, req Request) error {
	b := &pgx.Batch{}
	if a.external {
		events := []opstore.NewEvent{{Type: opstore.EventClaimed, To: string(opstatus.StateRunning), Actor: a.caller.Actor, Detail: a.claimDetail()}}
		if err := opstore.QueueCreate(b, newOperation(a.op), events); err != nil {
			return err
		}
		if err := tx.Send(ctx, b); err != nil {
			return err
		}
	} else {
		opstore.QueueKeyFree(b, a.op.AccountID, a.key, errKeyTaken)
		tx.Queue(b)
	}
	if err := h.checkClaimLineage(ctx, tx, a, req); err != nil {
		return err
	}
	if req.Guard != nil {
		return req.Guard(ctx, tx.Gorm(), a.op, a.fingerprint)
	}
	return nil
}

// completion is the batch that stores res as a's response, with a's operation in res's state and an event of
// type event by a's caller; it must go with the COMMIT. An external operation is moved in place, and the batch
// fails with ErrAlreadySettled when another worker settled it first; a local one is inserted, completed.
func (h *Handler) completion(a *attempt, res Result, event string) (response, *pgx.Batch, error) {
	resp, err := render(res)
	if err != nil {
		return response{}, nil, err
	}
	detail := a.completionDetail(resp.Status, res.Reason)
	if !a.external {
		// A local write's one event records its claim too.
		detail.SupersedesOperationID, detail.Owner = a.lineage.supersedes, a.owner
	}
	a.op.State = res.State
	if a.op.State == "" {
		a.op.State = opstatus.StateSucceeded
	}
	if res.Resource == nil && a.op.State == opstatus.StateSucceeded && resp.Status < 300 {
		h.warnNoResource(a.op.Kind)
	}
	b := &pgx.Batch{}
	c := opstore.Completion{State: string(a.op.State),
		Event:  opstore.NewEvent{Type: event, Actor: a.caller.Actor, Detail: detail},
		Status: resp.Status, Header: resp.Header, Body: resp.Body, Retention: h.retention(), Lifetime: h.keyLifetime()}
	if r := res.Resource; r != nil {
		c.ResourceType, c.ResourceID = &r.Type, &r.ID
	}
	if a.external {
		err = opstore.QueueComplete(b, a.op.AccountID, a.op.ID, c)
	} else {
		err = opstore.QueueCreateCompleted(b, newOperation(a.op), c)
	}
	return resp, b, err
}

// warnNoResource tells the operator, once per kind, that a write succeeded without naming what it made: once its
// stored answer is pruned, a retry's 409 idempotency_response_expired points at the resource, and there is none.
func (h *Handler) warnNoResource(kind string) {
	if _, told := h.resourceWarned.LoadOrStore(kind, true); told {
		return
	}
	h.log().Warn("idem: a write succeeded without Result.Resource: after its answer is pruned, a retry is told to read the "+
		"result at its resource, and none is named; set Resource to what the write made or acted on", "kind", kind)
}

// errKeyTaken: a local claim found its key held once it had the key's lock (a copy committed first).
var errKeyTaken = errors.New("idem: the key is held by another operation")

// keyTaken reports whether a claim failed on a key another operation holds: a local claim's read under the
// key's lock, or the insert of an operation holding it (opstore.KeyTaken).
func keyTaken(err error) bool {
	return errors.Is(err, errKeyTaken) || opstore.KeyTaken(err)
}

// taken answers a request whose claim found the key taken, from the key as committed now (read in one round
// trip with the other requests' reads).
func (h *Handler) taken(ctx context.Context, a *attempt, header http.Header) Answer {
	s, found, err := h.readKey(ctx, a.op.AccountID, a.key)
	if err == nil && !found {
		// Released or pruned in between: nothing was done, and a retry claims it.
		err = fmt.Errorf("%w: the key was taken and gone again before it could be read", problem.ErrStoreUnavailable)
	}
	if err != nil {
		return h.fail(a.op.Kind, err)
	}
	return h.existing(ctx, a, s, header)
}

// ErrAlreadySettled is returned by Settle when another worker recorded the operation's outcome first.
var ErrAlreadySettled = opstore.ErrAlreadySettled

func render(res Result) (response, error) {
	body, err := json.Marshal(res.Body)
	if err != nil {
		return response{}, fmt.Errorf("idem: marshal response: %w", err)
	}
	header := http.Header{}
	for _, name := range []string{"Location", "Retry-After"} { // the headers a Result may store (Result.Header)
		if v := res.Header.Get(name); v != "" {
			header.Set(name, v)
		}
	}
	return response{Status: cmp.Or(res.Status, http.StatusOK), Header: header, Body: body}, nil
}

// ProblemResult turns a definite failure into a Result to store, so that retries of a request that failed for
// good replay the same problem instead of trying again.
func ProblemResult(err error, state opstatus.State) Result {
	status, doc := problem.Render(err)
	reason, _ := doc["code"].(string)
	return Result{Status: status, Body: doc, State: state, Reason: reason}
}

// answer is the Answer that sends resp, the response of operation opID.
func answer(opID string, resp response, replayed bool) Answer {
	h := http.Header{}
	maps.Copy(h, resp.Header)
	h.Set(headerOperationID, opID)
	h.Set("Content-Type", "application/json")
	if resp.Status >= 400 {
		h.Set("Content-Type", "application/problem+json")
		h.Set("Cache-Control", "no-store")
	}
	if replayed {
		h.Set(headerReplayed, "true")
	}
	return Answer{Status: resp.Status, Header: h, Body: resp.Body}
}

// newOperation is op as the store inserts it.
func newOperation(op opstatus.Operation) opstore.New {
	n := opstore.New{ID: op.ID, AccountID: op.AccountID, Kind: op.Kind, State: string(op.State),
		IdempotencyKey: op.IdempotencyKey, Fingerprint: op.Fingerprint, LeaseExpiresAt: op.LeaseExpiresAt}
	if r := op.Resource; r != nil {
		n.ResourceType, n.ResourceID = &r.Type, &r.ID
	}
	return n
}
