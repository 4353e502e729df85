package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// KeyState is where a claimed key stands: running until a response is stored, then completed.
type KeyState string

const (
	KeyRunning   KeyState = "running"
	KeyCompleted KeyState = "completed"
)

// Record is one claimed idempotency key.
type Record struct {
	AccountID   string
	Key         string
	Fingerprint string
	OperationID string
	State       KeyState
	// Response is set once the key is completed.
	Response *Response
	// OperationState is the state of the key's operation when the record was read.
	OperationState opstatus.State
	CreatedAt      time.Time
}

// Response is what a completed key replays, byte for byte.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Store keeps idempotency keys together with the opstatus operation each claim starts. Every method that
// writes takes the caller's transaction, so a claim, the business write and the stored response can commit
// together. The conformance suite in idemtest runs against every implementation.
type Store interface {
	// Claim inserts a running key for (op.AccountID, op.IdempotencyKey) with op.Fingerprint, and op itself with
	// its claimed event, unless the key already exists, atomically: of many concurrent claims exactly one returns
	// claimed=true. When the key exists, Claim returns the stored record and claimed=false and inserts nothing.
	// detail goes into the claimed event (the attempt that claimed).
	Claim(ctx context.Context, tx *gorm.DB, op opstatus.Operation, actor string, detail map[string]any) (stored Record, claimed bool, err error)
	// Lookup returns the record of (account, key). Returns an error matching problem.ErrNotFound if there is none.
	Lookup(ctx context.Context, db *gorm.DB, accountID, key string) (Record, error)
	// Complete stores the response of a running key and moves its operation, if it is running or unknown, to
	// c.State with one event. Returns ErrAlreadySettled, changing nothing, if the operation was already moved
	// out of running or unknown, and an error matching problem.ErrNotFound if the key is not running.
	Complete(ctx context.Context, tx *gorm.DB, c Completion) error
	// Release deletes the running key of (accountID, key) claimed by operation opID, so the key is free for a
	// new claim; the operation stays, settled by the caller in the same transaction. Returns ErrAlreadySettled,
	// changing nothing, if the key is no longer running under opID.
	Release(ctx context.Context, tx *gorm.DB, accountID, key, opID string) error
	// Prune deletes completed keys finished before cutoff whose operation is final. Keys of running, queued
	// and unknown operations are kept whatever their age.
	Prune(ctx context.Context, db *gorm.DB, cutoff time.Time) (int64, error)
}

// Completion is the outcome Complete records.
type Completion struct {
	AccountID   string
	Key         string
	OperationID string
	Response    Response
	State       opstatus.State
	Resource    *opstatus.Resource
	// Event is the type of the operation event (completed, reconciled) and Actor who records it. Detail is the
	// event's detail: the attempt record of the HTTP attempt that carried the result, or nil for a worker's
	// settlement ({"status": ...} then).
	Event  string
	Actor  string
	Detail map[string]any
}

// PostgresStore is the Store on PostgreSQL (the idempotency_keys table of migrations/).
type PostgresStore struct{}

var _ Store = PostgresStore{}

type keyRow struct {
	Claimed         bool // set only by Claim: this statement inserted the row
	AccountID       string
	IdempotencyKey  string
	Fingerprint     string
	OperationID     string
	State           KeyState
	ResponseStatus  *int
	ResponseHeaders *string
	ResponseBody    []byte
	OperationState  *string
	CreatedAt       time.Time
}

func (r keyRow) record() (Record, error) {
	rec := Record{
		AccountID: r.AccountID, Key: r.IdempotencyKey, Fingerprint: r.Fingerprint, OperationID: r.OperationID,
		State: r.State, CreatedAt: r.CreatedAt,
	}
	if r.OperationState != nil {
		rec.OperationState = opstatus.State(*r.OperationState)
	}
	if r.State == KeyCompleted && r.ResponseStatus != nil {
		resp := &Response{Status: *r.ResponseStatus, Body: r.ResponseBody, Header: http.Header{}}
		if r.ResponseHeaders != nil {
			if err := json.Unmarshal([]byte(*r.ResponseHeaders), &resp.Header); err != nil {
				return Record{}, fmt.Errorf("idem: stored headers: %w", err)
			}
		}
		rec.Response = resp
	}
	return rec, nil
}

// Claim implements Store with one statement: INSERT ... ON CONFLICT DO NOTHING on the primary key
// (account_id, key), and, only for a new claim, the operation and its claimed event. A concurrent claimer waits
// on the row until the first transaction ends; if the first commits it gets the conflict, if it rolls back (local
// mode: the write failed or the process died) the key is free again and the waiting claim takes it.
func (PostgresStore) Claim(ctx context.Context, tx *gorm.DB, op opstatus.Operation, actor string, detail map[string]any) (Record, bool, error) {
	with, err := operationClaim(op, actor, detail)
	if err != nil {
		return Record{}, false, err
	}
	return claim(ctx, tx, gormKeys(ctx, tx), op, with)
}

// ClaimKey implements LocalStore: Claim without the operation, which CompleteNew inserts.
func (PostgresStore) ClaimKey(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (Record, bool, error) {
	return claim(ctx, tx, gormKeys(ctx, tx), op, withItems{})
}

// withItems are WITH items that run in the claim's statement after the key's insert, reading it (claim).
type withItems struct {
	sql  string
	args []any
}

// operationClaim inserts the claim's operation, its claimed event and its chain's head, in the claim's
// statement. The chain is new, so the event is linked here (audit.NewOperationChain), as completeNew links its
// two, and the chaining trigger is skipped.
func operationClaim(op opstatus.Operation, actor string, detail map[string]any) (withItems, error) {
	if detail == nil {
		detail = map[string]any{}
	}
	raw, err := json.Marshal(detail)
	if err != nil {
		return withItems{}, fmt.Errorf("idem: claim: %w", err)
	}
	state := string(op.State)
	event := audit.OperationEvent{OperationID: op.ID, AccountID: op.AccountID, Type: opstatus.EventClaimed, Actor: actor,
		ToState: &state, Detail: raw, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	links, attempts, err := audit.NewOperationChain([]audit.OperationEvent{event}, []bool{audit.IsAttempt(detail)})
	if err != nil {
		return withItems{}, fmt.Errorf("idem: claim: %w", err)
	}
	link := links[0]
	return withItems{`, op AS (
    INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, lease_expires_at)
    SELECT operation_id, account_id, ?, ?, idempotency_key, fingerprint, ? FROM claim
    RETURNING id, account_id, state
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, to_state, actor, detail, created_at,
                                  attempt, chain_seq, prev_hash, hash)
    SELECT id, account_id, ?, state, ?, ?::jsonb, ?, ?::bigint, ?::bigint, ?, ? FROM op
), head AS (
    INSERT INTO audit_chain_heads (account_id, chain, seq, hash, prev_hash, attempts)
    SELECT account_id, id, ?, ?, ?, ? FROM op
)`, []any{op.Kind, op.State, op.LeaseExpiresAt,
		event.Type, actor, string(raw), event.CreatedAt, link.Attempt, link.Seq, link.PrevHash, link.Hash,
		link.Seq, link.Hash, link.PrevHash, attempts}}, nil
}

// keyQuery runs a statement whose rows are keyRows (queryKeys): through gorm, or sent with a pipelined
// transaction's BEGIN.
type keyQuery func(query string, args ...any) ([]keyRow, error)

func gormKeys(ctx context.Context, tx *gorm.DB) keyQuery {
	return func(query string, args ...any) ([]keyRow, error) { return queryKeys(ctx, tx, true, query, args...) }
}

// claim is Claim, with the statements of with in the same statement; first runs its first try. When the key
// exists the statement inserts nothing and returns no row, and a Lookup reads the stored key. The handlers read
// the key before they claim (Handler.findExisting), so a claim finds an existing key only when it was committed
// in between, mostly while this statement waited for the transaction that held it (a storm of copies): then the
// key was outside the statement's snapshot anyway, and only a new statement sees it.
func claim(ctx context.Context, tx *gorm.DB, first keyQuery, op opstatus.Operation, with withItems) (Record, bool, error) {
	query := first
	for attempt := 0; attempt < 3; attempt++ {
		args := append([]any{op.AccountID, op.IdempotencyKey, op.Fingerprint, op.ID}, with.args...)
		rows, err := query(`
WITH claim AS (`+claimKeySQL+`
    ON CONFLICT (account_id, idempotency_key) DO NOTHING
    RETURNING account_id, idempotency_key, fingerprint, operation_id, state, created_at
)`+with.sql+`
SELECT true AS claimed, account_id, idempotency_key, fingerprint, operation_id, state, NULL::integer AS response_status,
       NULL::text AS response_headers, NULL::bytea AS response_body, NULL::text AS operation_state, created_at
FROM claim`, args...)
		if err != nil {
			return Record{}, false, fmt.Errorf("idem: claim: %w", err)
		}
		if len(rows) == 1 {
			r, err := rows[0].record()
			r.OperationState = op.State
			return r, true, err
		}
		stored, err := PostgresStore{}.Lookup(ctx, tx, op.AccountID, op.IdempotencyKey)
		if err == nil {
			return stored, false, nil
		}
		if !problemIsNotFound(err) {
			return Record{}, false, err
		}
		// Pruned between the two statements: claim again.
		query = gormKeys(ctx, tx)
	}
	return Record{}, false, fmt.Errorf("idem: claim: key vanished three times while claiming")
}

// queryKeys runs a statement whose rows are keyRows, in keyRow's column order (claimed first when claimed), on
// db's connection or transaction directly: these run on every write and every retry, and gorm's row mapping
// cost more than the statement's round trip.
func queryKeys(ctx context.Context, db *gorm.DB, claimed bool, query string, args ...any) ([]keyRow, error) {
	rows, err := db.Statement.ConnPool.QueryContext(ctx, numbered(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanKeys(rows, claimed)
}

// scanKeys reads keyRows from database/sql's rows or pgx's.
func scanKeys(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
}, claimed bool) ([]keyRow, error) {
	var out []keyRow
	for rows.Next() {
		var r keyRow
		dest := []any{&r.AccountID, &r.IdempotencyKey, &r.Fingerprint, &r.OperationID, &r.State, &r.ResponseStatus,
			&r.ResponseHeaders, &r.ResponseBody, &r.OperationState, &r.CreatedAt}
		if claimed {
			dest = append([]any{&r.Claimed}, dest...)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// numbered turns the ? placeholders of query into $1, $2, ... (the queries given to it have no other ?). The
// statements of a write are the same few texts every time, so each is turned once and kept (a bounded number:
// a text made of values, which no caller passes, would only stop being kept).
func numbered(query string) string {
	if q, ok := numberedTexts.Load(query); ok {
		return q.(string)
	}
	q := renumber(query)
	if numberedKept.Add(1) <= maxNumberedKept {
		numberedTexts.Store(query, q)
	}
	return q
}

var (
	numberedTexts sync.Map // query -> numbered(query)
	numberedKept  atomic.Int64
)

const maxNumberedKept = 256

func renumber(query string) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] != '?' {
			b.WriteByte(query[i])
			continue
		}
		n++
		b.WriteString("$" + strconv.Itoa(n))
	}
	return b.String()
}

// lookupSQL reads a key with its operation's state. The state is a subquery on the operation's whole key, not a
// join: with the account known, a join lets the planner scan the account's operations and filter them by id, and
// a plan made while the tables were small (the cached, generic plan of a prepared statement) does exactly that,
// so every retry read all of an account's operations (TestLookupPlanReadsOneOperation).
const lookupSQL = `
SELECT k.account_id, k.idempotency_key, k.fingerprint, k.operation_id, k.state, k.response_status,
       k.response_headers::text AS response_headers, k.response_body,
       (SELECT o.state FROM operations o WHERE o.account_id = k.account_id AND o.id = k.operation_id) AS operation_state,
       k.created_at
FROM idempotency_keys k
WHERE k.account_id = ? AND k.idempotency_key = ?`

// lookupQuery is lookupSQL as pgx takes it.
var lookupQuery = numbered(lookupSQL)

// Lookup implements Store.
func (PostgresStore) Lookup(ctx context.Context, db *gorm.DB, accountID, key string) (Record, error) {
	rows, err := queryKeys(ctx, db, false, lookupSQL, accountID, key)
	if err != nil {
		return Record{}, fmt.Errorf("idem: lookup: %w", err)
	}
	if len(rows) == 0 {
		return Record{}, problem.NotFound("idempotency key")
	}
	return rows[0].record()
}

// KeyRef names one idempotency key.
type KeyRef struct {
	AccountID string
	Key       string
}

// BatchLookupStore is a Store that reads many keys in one statement. The handler reads the key of every request
// before it claims (a retry is answered from that read alone), and concurrent requests' reads go together
// through LookupMany (package batch): a read shares its round trip with the others of its moment instead of
// paying one of its own.
type BatchLookupStore interface {
	// LookupMany returns the record of each ref, in refs' order, and whether it exists.
	LookupMany(ctx context.Context, db *gorm.DB, refs []KeyRef) ([]Record, []bool, error)
}

var _ BatchLookupStore = PostgresStore{}

// LookupMany implements BatchLookupStore: one Lookup statement per key, all sent in one round trip
// (database.SendBatch), each keeping the generic plan TestLookupPlanReadsOneOperation checks.
//
// A key asked for more than once in a batch (copies of one request arriving together: a client's quick retries,
// a storm) is read once, and each copy gets its own Record decoded from that row.
func (PostgresStore) LookupMany(ctx context.Context, db *gorm.DB, refs []KeyRef) ([]Record, []bool, error) {
	distinct := make(map[KeyRef]int, len(refs))
	slot := make([]int, len(refs)) // refs[i] is read by the slot[i]th statement
	b := &pgx.Batch{}
	for i, r := range refs {
		j, ok := distinct[r]
		if !ok {
			j = len(distinct)
			distinct[r] = j
			b.Queue(lookupQuery, r.AccountID, r.Key)
		}
		slot[i] = j
	}
	rows := make([]*keyRow, len(distinct))
	err := database.SendBatch(ctx, db, b, func(br pgx.BatchResults) error {
		for j := range rows {
			res, err := br.Query()
			if err != nil {
				return err
			}
			keys, err := scanKeys(res, false)
			res.Close()
			if err != nil {
				return err
			}
			if len(keys) == 1 {
				rows[j] = &keys[0]
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("idem: lookup: %w", err)
	}
	records, found := make([]Record, len(refs)), make([]bool, len(refs))
	given := make([]bool, len(rows))
	for i := range refs {
		row := rows[slot[i]]
		if row == nil {
			continue
		}
		if given[slot[i]] {
			copied := *row // a later copy's Record shares no bytes with the first's
			copied.ResponseBody = bytes.Clone(row.ResponseBody)
			row = &copied
		}
		given[slot[i]] = true
		if records[i], err = row.record(); err != nil {
			return nil, nil, fmt.Errorf("idem: lookup: %w", err)
		}
		found[i] = true
	}
	return records, found, nil
}

// LocalStore is what a Store offers for local-mode writes that never read or reference their own operation
// (Request.OperationAtCompletion): the claim takes the key alone, and the operation is born at completion, in
// its final state, with its claimed and completion events. Nobody outside the transaction can tell the
// difference (the claim, the write and the completion commit together), and the operation is written once
// instead of inserted as running and updated, which saves a row version and its index entries per write.
type LocalStore interface {
	// ClaimKey is Claim without the operation and its claimed event.
	ClaimKey(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (stored Record, claimed bool, err error)
	// CompleteNew inserts op in c.State with its claimed event (actor, detail) and c's event, and stores c's
	// response on the running key op's claim took. Returns an error matching problem.ErrNotFound if the key is
	// not running under op.
	CompleteNew(ctx context.Context, tx *gorm.DB, op opstatus.Operation, actor string, detail map[string]any, c Completion) error
}

var _ LocalStore = PostgresStore{}

// CompleteNew implements LocalStore in one statement (completeNew).
func (PostgresStore) CompleteNew(ctx context.Context, tx *gorm.DB, op opstatus.Operation, actor string, detail map[string]any, c Completion) error {
	query, args, err := completeNew(op, actor, detail, c)
	if err != nil {
		return err
	}
	res, err := database.Query[struct{ Completed int }](tx.WithContext(ctx), query, args...)
	if err != nil {
		return fmt.Errorf("idem: complete: %w", err)
	}
	if len(res) != 1 || res[0].Completed == 0 {
		return fmt.Errorf("idem: complete: %w", problem.NotFound("running idempotency key"))
	}
	return nil
}

// completeNew is CompleteNew's statement: the key's response, then, only if the key was running under op, the
// operation, its two events and its chain's head. The operation's chain is new, so its two records are linked
// here (audit.NewOperationChain) and stored with the head: the database's chaining trigger, which would read and
// update the head for each, is skipped.
//
// When the key is not running under op nothing is written, and the transaction cannot commit: the key op's claim
// inserted names an operation that does not exist, and the key's foreign key, checked at COMMIT, fails it. That
// is what lets CompleteNewCommit send COMMIT without reading this statement's answer first.
func completeNew(op opstatus.Operation, actor string, detail map[string]any, c Completion) (string, []any, error) {
	header, err := json.Marshal(c.Response.Header)
	if err != nil {
		return "", nil, fmt.Errorf("idem: complete: headers: %w", err)
	}
	if detail == nil {
		detail = map[string]any{}
	}
	claimed, err := json.Marshal(detail)
	if err != nil {
		return "", nil, fmt.Errorf("idem: complete: %w", err)
	}
	evDetail := c.Detail
	if evDetail == nil {
		evDetail = map[string]any{"status": c.Response.Status}
	}
	completed, err := json.Marshal(evDetail)
	if err != nil {
		return "", nil, fmt.Errorf("idem: complete: %w", err)
	}
	var resType, resID *string
	if c.Resource != nil {
		resType, resID = &c.Resource.Type, &c.Resource.ID
	}
	// The events are the ones Claim and Complete write, in their order: claimed (to running), then the
	// completion (running to the final state).
	running, final := string(opstatus.StateRunning), string(c.State)
	at := time.Now().UTC().Truncate(time.Microsecond)
	events := []audit.OperationEvent{
		{OperationID: op.ID, AccountID: op.AccountID, Type: opstatus.EventClaimed, Actor: actor, ToState: &running,
			Detail: claimed, CreatedAt: at},
		{OperationID: op.ID, AccountID: op.AccountID, Type: c.Event, Actor: c.Actor, FromState: &running, ToState: &final,
			Detail: completed, CreatedAt: at},
	}
	links, attempts, err := audit.NewOperationChain(events, []bool{audit.IsAttempt(detail), audit.IsAttempt(evDetail)})
	if err != nil {
		return "", nil, fmt.Errorf("idem: complete: %w", err)
	}
	return `
WITH key AS (
    UPDATE idempotency_keys
    SET state = 'completed', response_status = ?, response_headers = ?::jsonb, response_body = ?, completed_at = now()
    WHERE account_id = ? AND idempotency_key = ? AND operation_id = ? AND state = 'running'
    RETURNING account_id, operation_id
), op AS (
    INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id)
    SELECT operation_id, account_id, ?, ?, ?, ?, ?, ? FROM key
    RETURNING id, account_id
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail, created_at,
                                  attempt, chain_seq, prev_hash, hash)
    SELECT op.id, op.account_id, v.type, v.from_state, v.to_state, v.actor, v.detail::jsonb, ?,
           v.attempt, v.seq, v.prev_hash, v.hash
    FROM op, (VALUES (?, NULL, ?, ?, ?, ?::bigint, ?::bigint, ?, ?), (?, ?, ?, ?, ?, ?::bigint, ?::bigint, ?, ?))
        AS v(type, from_state, to_state, actor, detail, attempt, seq, prev_hash, hash)
    ORDER BY v.seq
), head AS (
    INSERT INTO audit_chain_heads (account_id, chain, seq, hash, prev_hash, attempts)
    SELECT account_id, id, ?, ?, ?, ? FROM op
)
SELECT count(*) AS completed FROM key`, []any{
			c.Response.Status, string(header), c.Response.Body, c.AccountID, c.Key, op.ID,
			op.Kind, c.State, op.IdempotencyKey, op.Fingerprint, resType, resID,
			at,
			events[0].Type, running, actor, string(claimed), links[0].Attempt, links[0].Seq, links[0].PrevHash, links[0].Hash,
			events[1].Type, running, final, c.Actor, string(completed), links[1].Attempt, links[1].Seq, links[1].PrevHash, links[1].Hash,
			links[1].Seq, links[1].Hash, links[1].PrevHash, attempts,
		}, nil
}

// PipelinedStore is what a Store offers to spend no round trip of a local write on its transaction's BEGIN and
// COMMIT (database.PipelinedTx): the claim travels with BEGIN, and an operation born at completion (LocalStore)
// travels with COMMIT. The handler uses it when the Store has it.
type PipelinedStore interface {
	// ClaimBegin is Claim, sent with t's BEGIN.
	ClaimBegin(ctx context.Context, t *database.PipelinedTx, op opstatus.Operation, actor string, detail map[string]any) (Record, bool, error)
	// ClaimKeyBegin is LocalStore's ClaimKey, sent with t's BEGIN.
	ClaimKeyBegin(ctx context.Context, t *database.PipelinedTx, op opstatus.Operation) (Record, bool, error)
	// ClaimKeyWithNext is LocalStore's ClaimKey, queued to be sent with t's BEGIN and the transaction's next
	// statement, the write's first (database.PipelinedTx.BeginWithNext); begun runs once the key is claimed. It
	// does not read an existing key: it fails on it, and so does the statement sent with it, which then does
	// not run. t.BeginErr has the failure, which KeyTaken tells apart from others.
	ClaimKeyWithNext(t *database.PipelinedTx, op opstatus.Operation, begun func()) error
	// ClaimWithNext is Claim, queued like ClaimKeyWithNext: the key, the operation and its claimed event in one
	// statement, sent with t's BEGIN and the transaction's next statement. It does not read an existing key
	// either: it fails on it.
	ClaimWithNext(t *database.PipelinedTx, op opstatus.Operation, actor string, detail map[string]any, begun func()) error
	// KeyTaken reports whether err, a failure of ClaimKeyWithNext's or ClaimWithNext's statement, says that the
	// key exists.
	KeyTaken(err error) bool
	// CompleteNewCommit is LocalStore's CompleteNew, sent with t's COMMIT: t is committed when it returns nil,
	// and if CompleteNew would fail the COMMIT fails. Errors are PipelinedTx.Commit's.
	CompleteNewCommit(ctx context.Context, t *database.PipelinedTx, op opstatus.Operation, actor string, detail map[string]any, c Completion) error
}

var _ PipelinedStore = PostgresStore{}

// ClaimBegin implements PipelinedStore.
func (PostgresStore) ClaimBegin(ctx context.Context, t *database.PipelinedTx, op opstatus.Operation, actor string, detail map[string]any) (Record, bool, error) {
	with, err := operationClaim(op, actor, detail)
	if err != nil {
		return Record{}, false, err
	}
	return claim(ctx, t.DB(), beginKeys(ctx, t), op, with)
}

// ClaimKeyBegin implements PipelinedStore.
func (PostgresStore) ClaimKeyBegin(ctx context.Context, t *database.PipelinedTx, op opstatus.Operation) (Record, bool, error) {
	return claim(ctx, t.DB(), beginKeys(ctx, t), op, withItems{})
}

// claimKeySQL is the key's insert of every claim. Claim adds ON CONFLICT DO NOTHING; ClaimKeyWithNext and
// ClaimWithNext send it plain, so it fails on a key that exists (the primary key), or after waiting for the
// transaction that holds it, if that one commits, as ON CONFLICT would wait.
const claimKeySQL = `INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, operation_id, state)
VALUES (?, ?, ?, ?, 'running')`

// ClaimKeyWithNext implements PipelinedStore.
func (PostgresStore) ClaimKeyWithNext(t *database.PipelinedTx, op opstatus.Operation, begun func()) error {
	return t.BeginWithNext(begun, numbered(claimKeySQL), op.AccountID, op.IdempotencyKey, op.Fingerprint, op.ID)
}

// ClaimWithNext implements PipelinedStore: the key's insert, then the operation, its claimed event and its
// chain's head (operationClaim), as Claim's statement does, but failing where Claim's does nothing.
func (PostgresStore) ClaimWithNext(t *database.PipelinedTx, op opstatus.Operation, actor string, detail map[string]any, begun func()) error {
	with, err := operationClaim(op, actor, detail)
	if err != nil {
		return err
	}
	query := `
WITH claim AS (` + claimKeySQL + `
    RETURNING account_id, idempotency_key, fingerprint, operation_id
)` + with.sql + `
SELECT count(*) FROM claim`
	return t.BeginWithNext(begun, numbered(query), append([]any{op.AccountID, op.IdempotencyKey, op.Fingerprint, op.ID}, with.args...)...)
}

// KeyTaken implements PipelinedStore.
func (PostgresStore) KeyTaken(err error) bool {
	return problem.IsUniqueViolation(err, "idempotency_keys_pkey")
}

// beginKeys sends a claim with t's BEGIN.
func beginKeys(ctx context.Context, t *database.PipelinedTx) keyQuery {
	return func(query string, args ...any) ([]keyRow, error) {
		var rows []keyRow
		err := t.Begin(ctx, func(r pgx.Rows) (err error) {
			rows, err = scanKeys(r, true)
			return err
		}, numbered(query), args...)
		return rows, err
	}
}

// CompleteNewCommit implements PipelinedStore.
func (PostgresStore) CompleteNewCommit(ctx context.Context, t *database.PipelinedTx, op opstatus.Operation, actor string, detail map[string]any, c Completion) error {
	query, args, err := completeNew(op, actor, detail, c)
	if err != nil {
		return err
	}
	if err := t.Commit(ctx, numbered(query), args...); err != nil {
		return fmt.Errorf("idem: complete: %w", err)
	}
	return nil
}

// Complete implements Store in one statement: the operation row is locked and moved first, so concurrent
// completions of one operation (a late handler and a reconciler) queue on it and the second finds it settled.
func (PostgresStore) Complete(ctx context.Context, tx *gorm.DB, c Completion) error {
	header, err := json.Marshal(c.Response.Header)
	if err != nil {
		return fmt.Errorf("idem: complete: headers: %w", err)
	}
	evDetail := c.Detail
	if evDetail == nil {
		evDetail = map[string]any{"status": c.Response.Status}
	}
	detail, err := json.Marshal(evDetail)
	if err != nil {
		return fmt.Errorf("idem: complete: %w", err)
	}
	var resType, resID *string
	if c.Resource != nil {
		resType, resID = &c.Resource.Type, &c.Resource.ID
	}
	// FOR NO KEY UPDATE, not FOR UPDATE: an event insert holds its chain head (audit trigger) and then takes KEY
	// SHARE on the operation for its foreign key; FOR UPDATE would conflict with that and deadlock.
	rows, err := database.Query[struct{ Moved, Completed int }](tx.WithContext(ctx), `
WITH prev AS (
    SELECT account_id, id, state FROM operations WHERE account_id = ? AND id = ? FOR NO KEY UPDATE
), op AS (
    UPDATE operations o
    SET state = ?, updated_at = now(), lease_expires_at = NULL,
        resource_type = COALESCE(?, o.resource_type), resource_id = COALESCE(?, o.resource_id)
    FROM prev
    WHERE o.account_id = prev.account_id AND o.id = prev.id AND prev.state IN ('running', 'unknown')
    RETURNING o.id, o.account_id, prev.state AS from_state, o.state AS to_state
), ev AS (
    INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail)
    SELECT id, account_id, ?, from_state, to_state, ?, ?::jsonb FROM op
), key AS (
    UPDATE idempotency_keys
    SET state = 'completed', response_status = ?, response_headers = ?::jsonb, response_body = ?, completed_at = now()
    WHERE account_id = ? AND idempotency_key = ? AND state = 'running' AND EXISTS (SELECT 1 FROM op)
    RETURNING 1
)
SELECT (SELECT count(*) FROM op) AS moved, (SELECT count(*) FROM key) AS completed`,
		c.AccountID, c.OperationID, c.State, resType, resID,
		c.Event, c.Actor, string(detail),
		c.Response.Status, string(header), c.Response.Body, c.AccountID, c.Key)
	if err != nil {
		return fmt.Errorf("idem: complete: %w", err)
	}
	if len(rows) != 1 {
		return fmt.Errorf("idem: complete: %d result rows", len(rows))
	}
	res := rows[0]
	if res.Moved == 0 {
		return ErrAlreadySettled
	}
	if res.Completed == 0 {
		return fmt.Errorf("idem: complete: %w", problem.NotFound("running idempotency key"))
	}
	return nil
}

// Release implements Store.
func (PostgresStore) Release(ctx context.Context, tx *gorm.DB, accountID, key, opID string) error {
	res := tx.WithContext(ctx).Exec(`DELETE FROM idempotency_keys
WHERE account_id = ? AND idempotency_key = ? AND operation_id = ? AND state = 'running'`, accountID, key, opID)
	if res.Error != nil {
		return fmt.Errorf("idem: release: %w", res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrAlreadySettled
	}
	return nil
}

// Prune implements Store.
func (PostgresStore) Prune(ctx context.Context, db *gorm.DB, cutoff time.Time) (int64, error) {
	res := db.WithContext(ctx).Exec(`
DELETE FROM idempotency_keys k USING operations o
WHERE o.account_id = k.account_id AND o.id = k.operation_id AND k.state = 'completed' AND k.created_at < ? AND k.completed_at < ?
  AND o.state IN ('succeeded', 'failed', 'cancelled')`, cutoff, cutoff)
	if res.Error != nil {
		return 0, fmt.Errorf("idem: prune: %w", res.Error)
	}
	return res.RowsAffected, nil
}
