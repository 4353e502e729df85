// Package idem makes POST handlers of a gin + gorm service safe to retry.
//
// A caller names one intended action with an Idempotency-Key. The first request claims the key atomically
// (an INSERT on the primary key (account, key)) before any side effect; later requests with the same key and the same
// fingerprint (see Fingerprint) get the stored response again, byte for byte, with Idempotent-Replayed: true; the
// same key with another request is refused with 422 idempotency_key_reused. Each claim is an operation of package
// opstatus, so a caller that timed out can ask what happened.
//
// Who writes the operations table: the Store, in the claim's own statement (key, operation and claimed event in
// one round trip) and in the completion's (stored response, final state and event); every other change of an
// operation goes through opstatus (Transition, Append). A lifted copy keeps that split. A local write that never
// touches its own operation (Request.OperationAtCompletion) has it written once, at completion, in its final
// state, with both events (LocalStore): the same rows as seen after the commit, one row version fewer.
//
// A retry of a key already committed is answered from one read (Lookup) and its attempt record, with no claim
// transaction; attempt records of concurrent retries share commits (opstatus.GroupAppender), and so do the reads
// of concurrent requests share round trips (BatchLookupStore, package batch).
//
// Round trips are what a write costs most on a loopback connection, so with a PipelinedStore the claim travels
// with its transaction's BEGIN and the statement after it, and an operation born at completion with its COMMIT
// (database.PipelinedTx). A claim needs no answer before what follows it: if it fails on a key that exists,
// PostgreSQL skips the statements sent with it, and the handler reads the key. So a local write is the read, one
// round trip with BEGIN, the claim and the write's first statement, any further statements of the write, and
// the completion with COMMIT; an external claim goes with Prepare's first statement, or with its COMMIT.
//
// Local mode, for effects that live in the same database: the claim, the business write and the stored response
// commit in one transaction, so a crash leaves nothing behind and the key free. A concurrent copy of the request
// waits on the claimed row until that transaction ends and then replays its result (or, if it rolled back, takes
// the key itself); 409 request_in_progress is what copies see while an external effect is in flight, because
// only there is a running claim committed and visible.
//
// Example (Handler.Do) shows a whole handler; Example (DoExternal) the external mode.
//
// External mode (DoExternal), for effects that leave the process (a payment provider, a deploy target): the
// claim commits first with a lease, the effect runs outside any transaction, and its result is recorded after.
// When the answer is lost the operation becomes unknown, never deleted, and a Reconciler (package opstatus)
// settles it from the other side's records.
package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/batch"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Failpoints of idem (package failpoint), for crash tests: right after a claim (in local mode, before the
// write goes on; a claim sent with the write's first statement has that statement run too), just before and
// after an external call, and right before the commit of a local write
// (FailpointBeforeCommit) or of an external claim, after Prepare (FailpointExternalClaimed); those two pass the
// operation to functions set with failpoint.Set.
const (
	FailpointAfterClaim         = "idem.after_claim"
	FailpointBeforeExternalCall = "idem.external.before_call"
	FailpointAfterExternalCall  = "idem.external.after_call"
	FailpointBeforeCommit       = "idem.before_commit"
	FailpointExternalClaimed    = "idem.external.claimed"
)

// Response headers of the contract.
const (
	HeaderReplayed    = "Idempotent-Replayed"
	HeaderOperationID = "Operation-Id"
)

// storedHeaders is the allowlist of headers a Result may ask to store and replay.
var storedHeaders = []string{"Location", "Retry-After"}

// ErrOutcomeUnknown marks an effect whose result did not come back (timeout, dropped connection): it may or may
// not have happened. DoExternal leaves the operation unknown for the reconciler.
var ErrOutcomeUnknown = errors.New("idem: outcome unknown")

// Request describes one idempotent write.
type Request struct {
	// Kind names the operation, "<service>.<action>": tickets.create, payments.capture, ...
	Kind string
	// Command is the validated command, with defaults applied; its canonical JSON is part of the fingerprint.
	Command any
	// Guard, when set, runs right after a new claim, in the claim's transaction, before any effect: approvals
	// hook in here, so a replay of an approved request needs no new approval. An error rolls the claim back.
	Guard func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, fingerprint string) error
	// OperationAtCompletion says the write (Do) never reads or references its own operation row: no foreign
	// key to it, no opstatus call on it. The operation is then inserted once, at completion, in its final state
	// (LocalStore), instead of at the claim and moved again at completion. Ignored with a Guard, a
	// Supersedes-Operation-Id, or a Store that is no LocalStore.
	OperationAtCompletion bool
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

// WriteFunc does a local write inside tx, the transaction that holds the claim.
type WriteFunc func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (Result, error)

// Handler runs idempotent writes. Its zero value is not usable; set DB and Store (a nil Logger discards).
type Handler struct {
	DB     *gorm.DB
	Store  Store
	Logger *slog.Logger
	// Lease is how long an external effect may run before the recovery worker calls its outcome unknown,
	// counted from the claim's commit. It must be longer than the effect's own timeout.
	Lease time.Duration
	// DispatchMargin is the least lease an external effect must have left when its claim commits to be sent
	// at all; with less the claim is released unsent. Give it the effect's own timeout (Lease/4 when zero).
	DispatchMargin time.Duration
	// RetryAfter is the Retry-After, in seconds, of a 409 request_in_progress.
	RetryAfter int
	// MaxWait caps Prefer: wait=N (30 s when zero).
	MaxWait time.Duration
	// Reconcilers, by operation kind, let a retry of an unknown operation settle it at once (see reconcileNow);
	// cmd/retrysafe gives the handler the same ones the recovery worker uses.
	Reconcilers map[string]opstatus.Reconciler
	// Observer, when set, is told each request's outcome and each operation the handler settles (metrics).
	Observer Observer

	groupOnce  sync.Once
	group      *opstatus.GroupAppender
	lookupOnce sync.Once
	lookups    *batch.Batcher[KeyRef, lookup]
}

// log is h.Logger, or a logger that discards.
func (h *Handler) log() *slog.Logger {
	if h.Logger == nil {
		return discard
	}
	return h.Logger
}

var discard = slog.New(slog.DiscardHandler)

type call struct {
	key         string
	fingerprint string
	principal   auth.Principal
	// lineage is the HTTP attempt (Attempt-Id and the headers that place it), recorded in the events it
	// causes; empty for a worker's settlement.
	lineage lineage
	op      opstatus.Operation
	// late is set when the operation is inserted at completion (Request.OperationAtCompletion).
	late LocalStore
	// attemptRecorded is set, in an external effect's settling transaction, when the claiming attempt already
	// has its attempt record (opstatus.ExpireLeases wrote it).
	attemptRecorded bool
}

// begin validates the key and computes the fingerprint. It writes the problem and returns false on failure.
func (h *Handler) begin(c *gin.Context, req Request) (call, bool) {
	values := c.Request.Header.Values(HeaderKey)
	key, err := ParseKey(c.Request.Header.Get(HeaderKey), len(values) > 0)
	if err == nil && len(values) > 1 {
		err = problem.New(problem.CodeIdempotencyKeyInvalid, "send exactly one Idempotency-Key header")
	}
	if err != nil {
		h.observe(req.Kind, OutcomeRefused)
		problem.Write(c, err)
		return call{}, false
	}
	p := auth.From(c)
	params := make(map[string]string, len(c.Params))
	for _, param := range c.Params {
		params[param.Key] = param.Value
	}
	fp, err := Fingerprint(c.Request.Method, c.FullPath(), params, p.AccountID, req.Command)
	if err != nil {
		h.observe(req.Kind, OutcomeRefused)
		problem.Write(c, err)
		return call{}, false
	}
	lin, err := parseLineage(c)
	if err != nil {
		problem.Write(c, err)
		return call{}, false
	}
	return call{key: key, fingerprint: fp, principal: p, lineage: lin, op: opstatus.Operation{
		ID: opstatus.NewID(), AccountID: p.AccountID, Kind: req.Kind, State: opstatus.StateRunning,
		IdempotencyKey: key, Fingerprint: fp,
	}}, true
}

// errClaimTaken rolls back a claim transaction whose key already existed. read is false when the claim failed
// on the existing key without reading it (a claim sent with the write's first statement): the handler reads it.
type errClaimTaken struct {
	stored Record
	read   bool
}

func (errClaimTaken) Error() string { return "idem: key already claimed" }

// claim runs in tx: claim the key (with claimFn), create the operation, run the guard and prepare. It returns
// errClaimTaken when the key existed.
func (h *Handler) claim(ctx context.Context, tx *gorm.DB, cl call, req Request, claimFn func() (Record, bool, error)) error {
	stored, claimed, err := claimFn()
	if err != nil {
		return err
	}
	if !claimed {
		return errClaimTaken{stored, true}
	}
	if err := h.checkClaimLineage(ctx, tx, cl); err != nil {
		return err
	}
	if req.Guard != nil {
		if err := req.Guard(ctx, tx, cl.op, cl.fingerprint); err != nil {
			return err
		}
	}
	return nil
}

// claimIn is the claim of cl in tx, gorm's transaction.
func (h *Handler) claimIn(ctx context.Context, tx *gorm.DB, cl call) func() (Record, bool, error) {
	return func() (Record, bool, error) {
		if cl.late != nil {
			return cl.late.ClaimKey(ctx, tx, cl.op)
		}
		return h.Store.Claim(ctx, tx, cl.op, cl.principal.Actor(), cl.claimDetail())
	}
}

// findExisting reads the key's record before any transaction: a retry of a key that is already committed is
// answered from this one read (and its attempt record), without a claim that would only find the key taken and
// roll back. A key not visible yet (absent, or claimed by a transaction still running) goes through the claim,
// which waits for that transaction and decides; so does any error here, which the claim then reports. With a
// BatchLookupStore the reads of concurrent requests share statements.
func (h *Handler) findExisting(ctx context.Context, cl call) (Record, bool) {
	ref := KeyRef{AccountID: cl.op.AccountID, Key: cl.key}
	if lookups := h.batchedLookups(); lookups != nil {
		r, err := lookups.Do(ctx, ref.AccountID+"\x00"+ref.Key, ref)
		return r.Record, err == nil && r.found
	}
	stored, err := h.Store.Lookup(ctx, h.DB, ref.AccountID, ref.Key)
	return stored, err == nil
}

// lookup is one key's result in a batch of reads.
type lookup struct {
	Record
	found bool
}

// batchedLookups is the batcher of findExisting's reads, or nil when the Store reads one key at a time.
func (h *Handler) batchedLookups() *batch.Batcher[KeyRef, lookup] {
	h.lookupOnce.Do(func() {
		store, ok := h.Store.(BatchLookupStore)
		if !ok {
			return
		}
		h.lookups = &batch.Batcher[KeyRef, lookup]{Run: func(ctx context.Context, refs []KeyRef) ([]lookup, error) {
			records, found, err := store.LookupMany(ctx, h.DB, refs)
			if err != nil {
				return nil, err
			}
			out := make([]lookup, len(refs))
			for i := range refs {
				out[i] = lookup{records[i], found[i]}
			}
			return out, nil
		}}
	})
	return h.lookups
}

// claimDetail is the detail of the claimed event.
func (cl call) claimDetail() map[string]any {
	detail := cl.lineage.identity(nil)
	if cl.lineage.supersedes != "" {
		detail["supersedes_operation_id"] = cl.lineage.supersedes
	}
	return detail
}

// Do runs write once for the request's Idempotency-Key, in local mode, and writes the answer on c: the new
// result, the stored one, or a problem. write runs inside the transaction that holds the claim; if it returns an
// error nothing is stored and the key stays free.
func (h *Handler) Do(c *gin.Context, req Request, write WriteFunc) {
	cl, ok := h.begin(c, req)
	if !ok {
		return
	}
	ctx := c.Request.Context()
	if stored, ok := h.findExisting(ctx, cl); ok {
		h.answerExisting(c, cl, stored)
		return
	}
	if late, ok := h.Store.(LocalStore); ok && req.OperationAtCompletion && req.Guard == nil && cl.lineage.supersedes == "" {
		cl.late = late
	}
	var (
		resp       Response
		state      opstatus.State
		committing bool
	)
	err := h.inClaim(ctx, cl, req, func() { failpoint.Hit(FailpointAfterClaim) }, func(tx *gorm.DB) (*Completion, error) {
		res, err := write(ctx, tx, cl.op)
		if err != nil {
			return nil, err
		}
		state = resultState(res)
		var c Completion
		resp, c, err = h.completion(cl, res, opstatus.EventCompleted, cl.principal.Actor())
		return &c, err
	}, func() {
		failpoint.Hit(FailpointBeforeCommit, cl.op)
		committing = true
	})
	err = h.readTaken(ctx, cl, err)
	var taken errClaimTaken
	switch {
	case errors.As(err, &taken):
		h.answerExisting(c, cl, taken.stored)
	case committing && problem.IsStoreUnavailable(err):
		// The connection went away during COMMIT: the write may have committed. Only the same key can tell.
		// (pgconn.SafeToRetry is no proof that the COMMIT never left: pgx v5.12 reports a connection that
		// dropped under a simple-protocol statement as "conn closed", safe to retry.)
		h.observe(req.Kind, OutcomeUnknown)
		problem.Write(c, problem.OutcomeUnknown(cl.op.ID, err))
	case err != nil:
		h.observe(req.Kind, failureOutcome(err, OutcomeRefused))
		problem.Write(c, err)
	default:
		h.observe(req.Kind, OutcomeCreated)
		opstatus.ObserveFinished(h.OperationObserver(), req.Kind, state)
		// No log line of its own: the request's access log line names the operation, its account and status.
		writeResponse(c, cl.op.ID, resp, false)
	}
}

// readTaken reads the key of a claim that failed on it without reading it (errClaimTaken from claimWithNext),
// now that the claim's transaction is over; any other err is returned as it is. (A key pruned or released in
// between is not worth a loop: nothing was done, and the caller's retry claims it.)
func (h *Handler) readTaken(ctx context.Context, cl call, err error) error {
	var taken errClaimTaken
	if !errors.As(err, &taken) || taken.read {
		return err
	}
	stored, err := h.Store.Lookup(ctx, h.DB, cl.op.AccountID, cl.key)
	switch {
	case err == nil:
		return errClaimTaken{stored, true}
	case problemIsNotFound(err):
		return fmt.Errorf("%w: the key was taken and gone again before it could be read", problem.ErrStoreUnavailable)
	}
	return err
}

// inClaim runs a transaction that starts with cl's claim and goes on with body. body returns the completion to
// store before the commit (a local write's), or nil (an external claim, which commits alone); afterClaim and
// beforeCommit, when set, run right after the claim and right before the commit. With a PipelinedStore the
// claim is sent with the transaction's BEGIN and an operation born at completion with its COMMIT, two round
// trips fewer; beforeCommit then runs before the completion is sent. A claim that needs no check of its own
// before the write (an operation born at completion, no Retry-Of) waits for the write's first statement and goes
// with it, one round trip fewer again: afterClaim then runs once both have run.
func (h *Handler) inClaim(ctx context.Context, cl call, req Request, afterClaim func(), body func(tx *gorm.DB) (*Completion, error), beforeCommit func()) error {
	if afterClaim == nil {
		afterClaim = func() {}
	}
	if beforeCommit == nil {
		beforeCommit = func() {}
	}
	ps, ok := h.Store.(PipelinedStore)
	if !ok {
		return h.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := h.claim(ctx, tx, cl, req, h.claimIn(ctx, tx, cl)); err != nil {
				return err
			}
			afterClaim()
			c, err := body(tx)
			if err != nil {
				return err
			}
			if c != nil {
				if err := h.complete(ctx, tx, cl, *c); err != nil {
					return err
				}
			}
			beforeCommit()
			return nil
		})
	}
	t, err := database.BeginPipelined(ctx, h.DB)
	if err != nil {
		return err
	}
	defer t.Close()
	tx := t.DB()
	if cl.lineage.retryOf == "" {
		return h.claimWithNext(ctx, t, ps, cl, req, afterClaim, body, beforeCommit)
	}
	err = h.claim(ctx, tx, cl, req, func() (Record, bool, error) {
		if cl.late != nil {
			return ps.ClaimKeyBegin(ctx, t, cl.op)
		}
		return ps.ClaimBegin(ctx, t, cl.op, cl.principal.Actor(), cl.claimDetail())
	})
	if err != nil {
		return err
	}
	afterClaim()
	c, err := body(tx)
	if err != nil {
		return err
	}
	switch {
	case c != nil && cl.late != nil:
		beforeCommit()
		return ps.CompleteNewCommit(ctx, t, cl.op, cl.principal.Actor(), cl.claimDetail(), *c)
	case c != nil:
		if err := h.Store.Complete(ctx, tx, *c); err != nil {
			return err
		}
	}
	beforeCommit()
	return t.Commit(ctx, "")
}

// claimWithNext is inClaim's transaction for a claim that needs no answer before what follows it (no Retry-Of
// to check against the key): the claim is queued (PipelinedStore.ClaimKeyWithNext for an operation born at
// completion, ClaimWithNext for one claimed with it) and goes with BEGIN and the transaction's next statement,
// the first of the claim's own checks (Supersedes-Operation-Id), its Guard, or body's; with the completion and
// COMMIT when none sends one. So a ticket create is the read, BEGIN with the claim and the ticket's insert, and
// the completion with COMMIT; an external claim without statements of its own is one round trip. Nothing runs
// on a key the claim does not hold: when the key exists the claim fails, PostgreSQL skips the statement sent
// with it, and the transaction is aborted, so whatever the checks or body make of that, the claim's failure
// decides (errClaimTaken, with the key to read).
func (h *Handler) claimWithNext(ctx context.Context, t *database.PipelinedTx, ps PipelinedStore, cl call, req Request,
	afterClaim func(), body func(tx *gorm.DB) (*Completion, error), beforeCommit func()) error {
	var err error
	if cl.late != nil {
		err = ps.ClaimKeyWithNext(t, cl.op, afterClaim)
	} else {
		err = ps.ClaimWithNext(t, cl.op, cl.principal.Actor(), cl.claimDetail(), afterClaim)
	}
	if err != nil {
		return err
	}
	// decided is the claim's failure, when it failed, before anything else: what failed after it failed for it.
	decided := func(err error) error {
		cerr := t.BeginErr()
		switch {
		case cerr != nil && ps.KeyTaken(cerr):
			return errClaimTaken{}
		case cerr != nil:
			return fmt.Errorf("idem: claim: %w", cerr)
		}
		return err
	}
	tx := t.DB()
	queued := func() (Record, bool, error) { return Record{}, true, nil } // its failure shows in decided
	if err := h.claim(ctx, tx, cl, req, queued); err != nil {
		return decided(err)
	}
	c, err := body(tx)
	if err != nil {
		return decided(err)
	}
	if c != nil && cl.late == nil {
		if err := h.Store.Complete(ctx, tx, *c); err != nil {
			return decided(err)
		}
	}
	beforeCommit()
	if c != nil && cl.late != nil {
		err = ps.CompleteNewCommit(ctx, t, cl.op, cl.principal.Actor(), cl.claimDetail(), *c)
	} else {
		err = t.Commit(ctx, "")
	}
	if err != nil {
		return decided(err)
	}
	return nil
}

// storeResult stores res as the key's response and moves the operation to its state, in tx.
func (h *Handler) storeResult(ctx context.Context, tx *gorm.DB, cl call, res Result, event, actor string) (Response, error) {
	resp, c, err := h.completion(cl, res, event, actor)
	if err != nil {
		return Response{}, err
	}
	return resp, h.complete(ctx, tx, cl, c)
}

// complete stores the completion c of cl in tx.
func (h *Handler) complete(ctx context.Context, tx *gorm.DB, cl call, c Completion) error {
	if cl.late != nil {
		return cl.late.CompleteNew(ctx, tx, cl.op, cl.principal.Actor(), cl.claimDetail(), c)
	}
	return h.Store.Complete(ctx, tx, c)
}

// completion marshals res into the response to store and send, and the completion that stores it.
func (h *Handler) completion(cl call, res Result, event, actor string) (Response, Completion, error) {
	resp, err := response(res)
	if err != nil {
		return Response{}, Completion{}, err
	}
	var detail map[string]any
	switch {
	case cl.lineage.attempt != "" && cl.attemptRecorded:
		// The recovery worker already wrote this attempt's record (outcome unknown, its lease ran out): the
		// result is told without an outcome, so the attempt is not numbered twice.
		detail = cl.lineage.identity(map[string]any{"status": resp.Status})
	case cl.lineage.attempt != "":
		// The attempt that claimed the key: this event is its attempt record, in the commit of its result.
		detail = cl.record(AttemptCreatedOrRefused(resp.Status), resp.Status, nil)
	}
	if res.Reason != "" {
		if detail == nil {
			detail = map[string]any{"status": resp.Status}
		}
		detail["reason"] = res.Reason
	}
	return resp, Completion{
		AccountID: cl.op.AccountID, Key: cl.key, OperationID: cl.op.ID, Response: resp,
		State: resultState(res), Resource: res.Resource, Event: event, Actor: actor, Detail: detail,
	}, nil
}

// resultState is the operation's state once res is stored: succeeded unless res says otherwise.
func resultState(res Result) opstatus.State {
	if res.State == "" {
		return opstatus.StateSucceeded
	}
	return res.State
}

// ErrAlreadySettled is returned by Settle when another worker recorded the operation's outcome first.
var ErrAlreadySettled = errors.New("idem: operation already settled")

func response(res Result) (Response, error) {
	body, err := json.Marshal(res.Body)
	if err != nil {
		return Response{}, fmt.Errorf("idem: marshal response: %w", err)
	}
	header := http.Header{}
	for _, name := range storedHeaders {
		if v := res.Header.Get(name); v != "" {
			header.Set(name, v)
		}
	}
	status := res.Status
	if status == 0 {
		status = http.StatusOK
	}
	return Response{Status: status, Header: header, Body: body}, nil
}

// ProblemResult turns a definite failure into a Result to store, so that retries of a request that failed for
// good replay the same problem instead of trying again.
func ProblemResult(err error, state opstatus.State) Result {
	status, doc := problem.Render(err)
	reason, _ := doc["code"].(string)
	return Result{Status: status, Body: doc, State: state, Reason: string(reason)}
}

func writeResponse(c *gin.Context, opID string, resp Response, replayed bool) {
	for name, values := range resp.Header {
		c.Writer.Header()[name] = values
	}
	c.Header(HeaderOperationID, opID)
	contentType := "application/json"
	if resp.Status >= 400 {
		contentType = "application/problem+json"
		c.Header("Cache-Control", "no-store")
	}
	if replayed {
		c.Header(HeaderReplayed, "true")
	}
	c.Data(resp.Status, contentType, resp.Body)
}

// answerExisting answers a request whose key was already claimed: replay, conflict, in progress or unknown.
// Each answer is preceded by the attempt's record, durably: a retry whose evidence cannot be written gets an
// error, never an answer the record does not show.
func (h *Handler) answerExisting(c *gin.Context, cl call, stored Record) {
	ctx := c.Request.Context()
	kind := cl.op.Kind
	if cl.lineage.retryOf != "" {
		known, err := h.knownAttempt(ctx, stored.AccountID, stored.OperationID, cl.lineage.retryOf)
		if err != nil {
			h.observe(kind, failureOutcome(err, OutcomeRefused))
			problem.Write(c, err)
			return
		}
		if !known {
			h.observe(kind, OutcomeRefused)
			refusal := headerProblem(HeaderRetryOf, "names no earlier attempt of this operation")
			if err := h.recordAttempt(ctx, stored.OperationID, opstatus.EventAttemptRefused, cl, AttemptRefused,
				http.StatusBadRequest, map[string]any{"refusal": "unknown_retry_of"}); err != nil {
				refusal = err
			}
			problem.Write(c, refusal)
			return
		}
	}
	if stored.Fingerprint != cl.fingerprint {
		h.observe(kind, OutcomeConflict)
		err := h.recordAttempt(ctx, stored.OperationID, opstatus.EventConflictRejected, cl, AttemptConflictRejected,
			http.StatusUnprocessableEntity, map[string]any{"prior_fingerprint": stored.Fingerprint})
		if err != nil {
			problem.Write(c, err)
			return
		}
		problem.Write(c, problem.New(problem.CodeIdempotencyKeyReused,
			"this Idempotency-Key was first used for a different request; use a new key for a new action").
			With("operation_id", stored.OperationID).With("state", stored.OperationState))
		return
	}
	if wait := h.preferWait(c); wait > 0 && stored.State == KeyRunning && stored.OperationState != opstatus.StateUnknown {
		stored = h.waitFor(ctx, stored, wait)
	}
	if stored.OperationState == opstatus.StateUnknown {
		stored = h.reconcileNow(ctx, stored)
	}
	switch {
	case stored.State == KeyCompleted && stored.Response != nil:
		h.observe(kind, OutcomeReplayed)
		if err := h.recordAttempt(ctx, stored.OperationID, opstatus.EventReplayed, cl, AttemptReplayed, stored.Response.Status, nil); err != nil {
			problem.Write(c, err)
			return
		}
		writeResponse(c, stored.OperationID, *stored.Response, true)
	case stored.OperationState == opstatus.StateUnknown:
		h.observe(kind, OutcomeUnknown)
		if err := h.recordAttempt(ctx, stored.OperationID, opstatus.EventRetried, cl, AttemptUnknown, http.StatusAccepted, nil); err != nil {
			problem.Write(c, err)
			return
		}
		h.answerUnknown(c, cl.principal.AccountID, stored.OperationID)
	default:
		h.observe(kind, OutcomeInProgress)
		if err := h.recordAttempt(ctx, stored.OperationID, opstatus.EventRetried, cl, AttemptInProgress, http.StatusConflict,
			map[string]any{"state": stored.OperationState}); err != nil {
			problem.Write(c, err)
			return
		}
		problem.Write(c, &problem.Error{
			Code:       problem.CodeRequestInProgress,
			Detail:     "the first request with this Idempotency-Key is still running; retry after Retry-After seconds or send Prefer: wait=N",
			RetryAfter: max(h.RetryAfter, 1),
			Extensions: map[string]any{"operation_id": stored.OperationID, "state": stored.OperationState},
		})
	}
}

// reconcileNow asks the reconciler of the operation's kind to settle it while the caller waits, so a retry after
// a lost answer learns the outcome as soon as the other side can tell, not at the recovery worker's next pass.
// Whatever the reconciler decides, it decides from the other side's records; it never repeats the effect.
func (h *Handler) reconcileNow(ctx context.Context, stored Record) Record {
	op, err := opstatus.Get(ctx, h.DB, stored.AccountID, stored.OperationID)
	if err != nil || op.State != opstatus.StateUnknown {
		return stored
	}
	rec, ok := h.Reconcilers[op.Kind]
	if !ok {
		return stored
	}
	if err := rec.Reconcile(ctx, op); err != nil {
		opstatus.ObserveReconciled(h.OperationObserver(), op.Kind, opstatus.ReconcileError)
		h.log().InfoContext(ctx, "retry could not settle the operation yet", "operation_id", op.ID, "error", err.Error())
		return stored
	}
	latest, err := h.Store.Lookup(ctx, h.DB, stored.AccountID, stored.Key)
	if err != nil {
		return stored
	}
	result := opstatus.ReconcileSettled
	if latest.OperationState == opstatus.StateUnknown {
		result = opstatus.ReconcileStillUnknown
	}
	opstatus.ObserveReconciled(h.OperationObserver(), op.Kind, result)
	return latest
}

// answerUnknown is the 202 for an operation whose outcome is not known: the caller must not start a new
// action, but ask GET /v1/operations/{id} (or retry with the same key) until it settles.
func (h *Handler) answerUnknown(c *gin.Context, accountID, opID string) {
	op, err := opstatus.Get(c.Request.Context(), h.DB, accountID, opID)
	if err != nil {
		// Still unknown, only not readable now: the same answer without the operation's details.
		problem.Write(c, problem.OutcomeUnknown(opID, err))
		return
	}
	c.Header(HeaderOperationID, opID)
	c.Header("Location", "/v1/operations/"+opID)
	c.Header("Retry-After", "5")
	// The operation itself, and operation_id as CONVENTIONS.md names it in every answer about an operation.
	httpserver.JSON(c, http.StatusAccepted, struct {
		opstatus.Operation
		OperationID string `json:"operation_id"`
	}{op, opID})
}

// preferWait parses `Prefer: wait=N` (RFC 7240), capped at MaxWait.
func (h *Handler) preferWait(c *gin.Context) time.Duration {
	limit := h.MaxWait
	if limit <= 0 {
		limit = 30 * time.Second
	}
	for _, pref := range c.Request.Header.Values("Prefer") {
		for _, part := range strings.Split(pref, ",") {
			name, value, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok || !strings.EqualFold(name, "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSpace(value))
			if err != nil || n <= 0 {
				continue
			}
			return min(time.Duration(n)*time.Second, limit)
		}
	}
	return 0
}

// waitFor polls the key until it completes, its operation becomes unknown, or wait passes.
func (h *Handler) waitFor(ctx context.Context, stored Record, wait time.Duration) Record {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return stored
		case <-deadline.C:
			return stored
		case <-tick.C:
		}
		latest, err := h.Store.Lookup(ctx, h.DB, stored.AccountID, stored.Key)
		if err != nil {
			return stored
		}
		if latest.State == KeyCompleted || latest.OperationState == opstatus.StateUnknown {
			return latest
		}
	}
}

func problemIsNotFound(err error) bool { return errors.Is(err, problem.ErrNotFound) }
