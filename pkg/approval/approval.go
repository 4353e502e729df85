// Package approval binds a person's approval to one exact request: one account, one idempotency key and one
// request fingerprint. An agent asks for it with the request it intends to send; an approver (a key with role
// approver, not the requester) grants or denies it; the write names it in Approval-Id.
//
// A service lists the routes that can need approval, each able to turn a request body into the validated
// command and a summary a person must see:
//
//	approvals := approval.New(pool, idemHandler, time.Hour, approval.Route{ // pool: a database.Pool
//		Method: "POST", Path: "/v1/deploys",
//		Describe: func(ctx context.Context, account string, params map[string]string, body json.RawMessage) (any, map[string]any, error) {
//			cmd, err := decodeDeploy(body)
//			return cmd, map[string]any{"environment": cmd.Environment, "artifact": cmd.Artifact}, err
//		},
//	})
//	httpserver.Mount(api, approvals.Routes()) // or, on a ServeMux, mux.Handle(pattern, h) for each
//	// in the write's handler:
//	h.Handle(w, r, idem.Request{Kind: "deploys.create", Command: cmd, Guard: approvals.Guard(r.Header, cmd.Environment == "production"),
//		Takes: []string{approval.HeaderApprovalID}}, write)
//
// The guard runs only after a new claim, so a replay of an approved request needs no new approval.
//
// Statements run on database/sql handles (database.DBTX, database.Pool); gorm appears only in the types of the
// callbacks idem runs in its claim transaction (a guard, a write), whose handle idem passes as a *gorm.DB.
package approval

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// HeaderApprovalID is the request header that names the approval of a write.
const HeaderApprovalID = idem.HeaderApprovalID

// idPrefix starts every approval id (ids.New).
const idPrefix = "apv_"

// State of an approval.
type State string

const (
	StatePending  State = "pending"
	StateApproved State = "approved"
	StateDenied   State = "denied"
	// StateRevoked: approved, then withdrawn before the write used it; the guard refuses it like a denial.
	StateRevoked State = "revoked"
	// StateExpired: pending, or approved and never used, past its expires_at; it can no longer authorize
	// anything. It reads expired from that moment; it is stored, with its `expired` audit record, when the
	// expiry worker (ExpiryWorker) or a decision that comes too late finds it.
	StateExpired State = "expired"
)

// shown is a as callers read it at now: expired once it can no longer be used.
func (a Approval) shown(now time.Time) Approval {
	if (a.State == StatePending || (a.State == StateApproved && a.UsedByOperationID == nil)) && !now.Before(a.ExpiresAt) {
		a.State = StateExpired
	}
	return a
}

// Route is a write route that may need approval.
type Route struct {
	Method string
	// Path is the gin route template, e.g. "/v1/payment_intents/:id/capture".
	Path string
	// Describe decodes and validates body exactly as the write's handler does and returns the command whose
	// fingerprint idem computes, and the summary a person must see to decide.
	Describe func(ctx context.Context, accountID string, params map[string]string, body json.RawMessage) (command any, summary map[string]any, err error)
}

// match reports whether path fits the route's template, written the one way Request.Validate accepts (no
// trailing, doubled or missing slash), and returns its parameters.
func (r Route) match(method, path string) (map[string]string, bool) {
	if !strings.EqualFold(method, r.Method) {
		return nil, false
	}
	want := strings.Split(r.Path, "/")
	got := strings.Split(path, "/")
	if len(want) != len(got) {
		return nil, false
	}
	params := map[string]string{}
	for i, seg := range want {
		if name, ok := strings.CutPrefix(seg, ":"); ok {
			if got[i] == "" {
				return nil, false
			}
			params[name] = got[i]
			continue
		}
		if seg != got[i] {
			return nil, false
		}
	}
	return params, true
}

// Expire stores state expired on up to limit approvals that ran out by now (pending, or approved and never
// used, past expires_at), so each gets its `expired` audit record, and returns how many it moved. Replicas may
// run it at once: each skips the rows another holds, and the UPDATE moves only rows still pending or approved
// and unused, so no approval is recorded expired twice, and none a write is using at that moment.
func Expire(ctx context.Context, db database.DBTX, now time.Time, limit int) (int, error) {
	res, err := db.ExecContext(ctx, `
UPDATE approvals SET state = 'expired'
WHERE (account_id, id) IN (SELECT account_id, id FROM approvals
             WHERE state IN ('pending', 'approved') AND used_by_operation_id IS NULL AND expires_at <= $1
             ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
  AND state IN ('pending', 'approved') AND used_by_operation_id IS NULL AND expires_at <= $1`, now, limit)
	if err != nil {
		return 0, fmt.Errorf("approval: expire: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("approval: expire: %w", err)
	}
	return int(n), nil
}

// ExpiryWorker records the expiry of approvals that run out (Expire), every Interval, until its context ends.
type ExpiryWorker struct {
	DB       database.DBTX
	Interval time.Duration
	Logger   *slog.Logger
	// Now is the clock (time.Now when nil); the guard and decisions read expiry by the same one.
	Now func() time.Time
}

// expireBatch bounds one Expire statement, so a backlog is worked through in short transactions.
const expireBatch = 500

// Run expires approvals every w.Interval until ctx ends.
func (w *ExpiryWorker) Run(ctx context.Context) {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		w.RunOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce expires every approval that has run out, a batch at a time, and returns how many it moved.
func (w *ExpiryWorker) RunOnce(ctx context.Context) int {
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	total := 0
	for ctx.Err() == nil {
		n, err := Expire(ctx, w.DB, now(), expireBatch)
		total += n
		if err != nil {
			if ctx.Err() == nil && w.Logger != nil {
				w.Logger.WarnContext(ctx, "approval expiry failed", "error", err)
			}
			break
		}
		if n < expireBatch {
			break
		}
	}
	return total
}

// Approval is one request for approval.
type Approval struct {
	ID                string     `json:"id"`
	AccountID         string     `json:"-"`
	Method            string     `json:"method"`
	Path              string     `json:"path"`
	Route             string     `json:"-"`
	IdempotencyKey    string     `json:"idempotency_key"`
	Fingerprint       string     `json:"fingerprint"`
	Summary           Summary    `json:"summary"`
	State             State      `json:"state"`
	RequestedBy       string     `json:"requested_by"`
	DecidedBy         *string    `json:"decided_by"`
	DecidedAt         *time.Time `json:"decided_at"`
	ExpiresAt         time.Time  `json:"expires_at"`
	UsedByOperationID *string    `json:"used_by_operation_id"`
	CreatedAt         time.Time  `json:"created_at"`
	// Body is the request body the write will send, RFC 8785 canonical (nil for approvals older than the
	// column): what an approver reads in the console.
	Body *string `json:"-"`
}

// Summary is what a person must see to decide: environment, service, artifact and rollback target; or amount,
// currency and order. It is stored as jsonb.
type Summary map[string]any

// Scan implements sql.Scanner for the jsonb column. Numbers are read as json.Number, digit for digit: an
// approver is shown the number stored, not its nearest float64.
func (s *Summary) Scan(v any) error {
	var raw []byte
	switch b := v.(type) {
	case []byte:
		raw = b
	case string:
		raw = []byte(b)
	case nil:
		*s = nil
		return nil
	default:
		return fmt.Errorf("approval: summary: cannot scan %T", v)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return dec.Decode(s)
}

// Service stores approvals and checks them.
type Service struct {
	db     database.Pool
	idem   *idem.Handler
	ttl    time.Duration
	routes []Route
	now    func() time.Time
}

// New returns a Service for routes; approvals expire ttl after they are requested.
func New(db database.Pool, h *idem.Handler, ttl time.Duration, routes ...Route) *Service {
	return &Service{db: db, idem: h, ttl: ttl, routes: routes, now: time.Now}
}

// Request is the body of POST /v1/approvals: the exact write the agent intends to send. SupersedesOperationID,
// when set, is the Supersedes-Operation-Id the write will carry: the approval then lets it replace that
// operation while its outcome is unknown (SupersedeUnknown), and its summary shows what is known of it.
type Request struct {
	Method                string          `json:"method"`
	Path                  string          `json:"path"`
	IdempotencyKey        string          `json:"idempotency_key"`
	Body                  json.RawMessage `json:"body"`
	SupersedesOperationID string          `json:"supersedes_operation_id,omitempty"`
}

// Longest method and path a Request may name; no route comes near them.
const (
	MaxMethodLength = 16
	MaxPathLength   = 2048
)

// Validate checks the request's shape; Describe checks the body. The path is text a person reads and its
// segments reach SQL through Describe, so it is held to problem.CheckText; and it is the path the write will
// be sent to, so it is refused unless written the one way a route's path is (canonicalPath): an approver must
// not read /v1/deploys/ or //v1/deploys for /v1/deploys.
func (r *Request) Validate() error {
	var errs []problem.FieldError
	errs = problem.CheckText(errs, "method", r.Method, MaxMethodLength, true)
	before := len(errs)
	errs = problem.CheckText(errs, "path", r.Path, MaxPathLength, true)
	if len(errs) == before && !canonicalPath(r.Path) {
		errs = append(errs, problem.FieldError{Field: "path",
			Message: "must be written as the route is: one leading slash, no trailing or doubled slash, no . or .. segment (/v1/deploys)"})
	}
	if _, err := idem.ParseKey(r.IdempotencyKey, true); err != nil {
		errs = append(errs, problem.FieldError{Field: "idempotency_key", Message: "must be 1 to 255 printable ASCII characters"})
	}
	if r.SupersedesOperationID != "" && !ids.Valid("op_", r.SupersedesOperationID) {
		errs = append(errs, problem.FieldError{Field: "supersedes_operation_id", Message: "must be an operation id (op_...)"})
	}
	if len(r.Body) == 0 || r.Body[0] != '{' {
		errs = append(errs, problem.FieldError{Field: "body", Message: "must be the JSON object the write will send"})
	}
	if len(errs) > 0 {
		return problem.Validation(errs...)
	}
	return nil
}

// canonicalPath reports whether p is a URL path written the one way: absolute, and unchanged by path.Clean
// (no trailing or doubled slash, no . or .. segment).
func canonicalPath(p string) bool {
	return strings.HasPrefix(p, "/") && path.Clean(p) == p
}

// bound is a Request resolved against the routes: what the approval binds.
type bound struct {
	Method         string         `json:"method"`
	Path           string         `json:"path"`
	Route          string         `json:"route"`
	IdempotencyKey string         `json:"idempotency_key"`
	Fingerprint    string         `json:"fingerprint"`
	Supersedes     string         `json:"supersedes_operation_id,omitempty"`
	Summary        map[string]any `json:"-"`
	Body           string         `json:"-"`
}

func (s *Service) bind(ctx context.Context, accountID string, req Request) (bound, error) {
	for _, r := range s.routes {
		params, ok := r.match(req.Method, req.Path)
		if !ok {
			continue
		}
		cmd, summary, err := r.Describe(ctx, accountID, params, req.Body)
		if err != nil {
			var pe *problem.Error
			if errors.As(err, &pe) {
				// Name the field inside the proposed body, so the agent knows which part to fix.
				for i := range pe.Fields {
					pe.Fields[i].Field = "body." + pe.Fields[i].Field
				}
			}
			return bound{}, err
		}
		fp, err := idem.Fingerprint(r.Method, r.Path, params, accountID, cmd)
		if err != nil {
			return bound{}, err
		}
		body, err := auditchain.Canonical(req.Body)
		if err != nil {
			return bound{}, problem.Validation(problem.FieldError{Field: "body", Message: "must be the JSON object the write will send"})
		}
		if req.SupersedesOperationID != "" {
			prior, err := s.superseded(ctx, accountID, req.SupersedesOperationID)
			if err != nil {
				return bound{}, err
			}
			summary[summarySupersedes] = prior
		}
		return bound{Method: r.Method, Path: req.Path, Route: r.Path, IdempotencyKey: req.IdempotencyKey, Fingerprint: fp,
			Supersedes: req.SupersedesOperationID, Summary: summary, Body: string(body)}, nil
	}
	return bound{}, problem.Validation(problem.FieldError{Field: "path", Message: "this service has no write at this method and path that takes approvals"})
}

// Guard returns the idem.Request.Guard for a write, which requires an approval when required is true. It runs
// in the claim transaction and marks the approval used by the operation, so one approval authorizes one
// operation. The write's idem.Request takes HeaderApprovalID (Takes).
func (s *Service) Guard(h http.Header, required bool) func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, fingerprint string) error {
	return s.GuardWhen(h, func(context.Context, *gorm.DB) (bool, error) { return required, nil })
}

// GuardWhen is Guard for a write whose need of approval depends on what is stored (a running total of
// refunds): needed runs first, in the claim transaction, where it can lock what it reads, so the decision and
// the write see the same state. An Approval-Id sent is checked whether or not it is needed: one that cannot
// apply to the request (unknown, of another request, of one that supersedes an operation this one does not)
// is refused, never ignored.
func (s *Service) GuardWhen(h http.Header, needed func(ctx context.Context, tx *gorm.DB) (bool, error)) func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, fingerprint string) error {
	id, supersedes, grant := h.Get(HeaderApprovalID), h.Get(idem.HeaderSupersedes), grantUseOf(h)
	return func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, fingerprint string) error {
		need, err := needed(ctx, tx)
		switch {
		case err != nil:
			return err
		case id != "" && grant.id != "":
			return problem.New("grant_invalid", "send %s or %s, not both", HeaderApprovalID, HeaderGrantID).With("reason", "with_approval")
		case id != "":
			return s.use(ctx, database.SQL(tx), op, fingerprint, id, supersedes, false)
		case grant.id != "":
			return s.useGrant(ctx, database.SQL(tx), op, grant)
		case need:
			return problem.New("approval_required",
				"this write needs a person's approval: POST /v1/approvals with this exact request, have an approver approve it, then send its id in Approval-Id")
		}
		return nil
	}
}

// SupersedeUnknown returns the idem.Request.SupersedeUnknown of a write: with an Approval-Id, the approval must
// be approved, unexpired and unused, of this exact request, and name in supersedes_operation_id the operation
// the write supersedes, so the person who approved it was shown that operation (its state, last dispatch and
// reason: the summary's "supersedes"). Without one, the write is refused as idem refuses it.
func (s *Service) SupersedeUnknown(h http.Header) func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, fingerprint, supersedes string) (bool, error) {
	id := h.Get(HeaderApprovalID)
	return func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, fingerprint, supersedes string) (bool, error) {
		if id == "" {
			return false, nil
		}
		return true, s.use(ctx, database.SQL(tx), op, fingerprint, id, supersedes, true)
	}
}

// use checks, in the claim transaction of op, that approval id authorizes op's request (fingerprint, and
// supersedes, the Supersedes-Operation-Id it carries, "" when none) and marks it used by op, so one approval
// authorizes one operation. An approval that names a superseded operation authorizes only a request that
// supersedes it; unknown (the superseded operation's outcome is unknown) also asks that it name it. An approval
// a Guard and SupersedeUnknown both check is marked and recorded once.
func (s *Service) use(ctx context.Context, tx database.DBTX, op opstatus.Operation, fingerprint, id, supersedes string, unknown bool) error {
	if !ids.Valid(idPrefix, id) {
		// Never looked up: a header value that no approval id can be (NUL, invalid UTF-8) must not reach SQL.
		return problem.New("approval_invalid", "no such approval in this account")
	}
	var a Approval
	found, err := scanOne(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM approvals WHERE account_id = $1 AND id = $2 FOR UPDATE`, op.AccountID, id), &a)
	if err != nil {
		return fmt.Errorf("approval: load %s: %w", id, err)
	}
	reason := s.unusable(a, found)
	if reason == "" {
		reason = mismatch(a, op, fingerprint, supersedes, unknown)
	}
	if reason != "" {
		return problem.New("approval_invalid", "%s", reason).With("approval_id", id)
	}
	if a.UsedByOperationID != nil {
		return nil // this operation's other check used it already
	}
	return markUsed(ctx, tx, op, a, supersedes)
}

// unusable says why approval a (found false when there is none) authorizes no write now, or "" when it is
// approved and unexpired.
func (s *Service) unusable(a Approval, found bool) string {
	switch {
	case !found:
		return "no such approval in this account"
	case a.shown(s.now()).State == StateExpired:
		return "the approval expired"
	case a.State != StateApproved:
		return "the approval is " + string(a.State)
	case !s.now().Before(a.ExpiresAt):
		return "the approval expired"
	}
	return ""
}

// mismatch says why approval a does not authorize op's request (fingerprint, supersedes, and unknown as use
// takes them), or "" when it does.
func mismatch(a Approval, op opstatus.Operation, fingerprint, supersedes string, unknown bool) string {
	switch {
	case a.IdempotencyKey != op.IdempotencyKey:
		return "the approval is bound to another Idempotency-Key"
	case a.Fingerprint != fingerprint:
		return "the request differs from the one that was approved"
	case a.Supersedes() != "" && a.Supersedes() != supersedes:
		return "the approval is of a request that supersedes operation " + a.Supersedes() + ", sent with " + idem.HeaderSupersedes + ": " + a.Supersedes()
	case unknown && a.Supersedes() != supersedes:
		return "the approval does not name operation " + supersedes + ", whose outcome is unknown, as the one this request supersedes: " +
			"ask for one with supersedes_operation_id, so the approver sees it"
	case a.UsedByOperationID != nil && *a.UsedByOperationID != op.ID:
		return "the approval was already used by another operation"
	}
	return ""
}

// markUsed marks approval a used by op and records on op that it was checked.
func markUsed(ctx context.Context, tx database.DBTX, op opstatus.Operation, a Approval, supersedes string) error {
	_, err := tx.ExecContext(ctx, `UPDATE approvals SET used_by_operation_id = $1 WHERE account_id = $2 AND id = $3`,
		op.ID, op.AccountID, a.ID)
	if err != nil {
		return fmt.Errorf("approval: use %s: %w", a.ID, err)
	}
	detail := map[string]any{"approval_id": a.ID, "approved_by": a.DecidedBy}
	if supersedes != "" {
		detail["supersedes_operation_id"] = supersedes
	}
	return opstatus.Append(ctx, tx, op.AccountID, op.ID, "approval_checked", "system:approval", detail)
}

// summarySupersedes is the summary's key for what is known of the operation an approved write supersedes.
const summarySupersedes = "supersedes"

// Supersedes is the operation the approved write supersedes ("" when none): the operation_id of its summary's
// "supersedes".
func (a Approval) Supersedes() string {
	prior, _ := a.Summary[summarySupersedes].(map[string]any)
	id, _ := prior["operation_id"].(string)
	return id
}

// superseded is the summary's "supersedes": operation_id, kind, state, dispatch_state (not_sent,
// sent_no_response, response_received, execution_error; started when only its start was recorded; none when it
// made no call) and reason (or none), with its intent and the planned recovery (addRecoveryCard).
func (s *Service) superseded(ctx context.Context, accountID, opID string) (map[string]any, error) {
	r, found, err := opstore.ReadPrior(ctx, s.db, accountID, opID)
	if err != nil {
		return nil, fmt.Errorf("approval: superseded operation %s: %w", opID, err)
	}
	if !found {
		return nil, problem.Validation(problem.FieldError{Field: "supersedes_operation_id", Message: "names no operation of this account"})
	}
	dispatch, reason := "none", "none"
	if r.Dispatch != nil {
		dispatch = strings.TrimPrefix(*r.Dispatch, "dispatch_")
	}
	if r.Reason != nil {
		reason = *r.Reason
	}
	card := map[string]any{"operation_id": opID, "kind": r.Kind, "state": r.State, "dispatch_state": dispatch, "reason": reason}
	addRecoveryCard(card, opID, r)
	return card, nil
}

// UsedBy returns approval id as op's guard accepted it in tx (it marks the approval used by op there); ok is
// false unless id names an approval op used. A write reads here what its approver was shown beyond the request
// itself, in the same transaction, after the guard: a deploy runs at the environment version its card showed.
func UsedBy(ctx context.Context, tx database.DBTX, op opstatus.Operation, id string) (a Approval, ok bool, err error) {
	if !ids.Valid(idPrefix, id) {
		return Approval{}, false, nil
	}
	ok, err = scanOne(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM approvals WHERE account_id = $1 AND id = $2 AND used_by_operation_id = $3`,
		op.AccountID, id, op.ID), &a)
	if err != nil {
		return Approval{}, false, fmt.Errorf("approval: load %s: %w", id, err)
	}
	return a, ok, nil
}

const columns = `id, account_id, method, path, route, idempotency_key, fingerprint, summary, state, requested_by,
decided_by, decided_at, expires_at, used_by_operation_id, created_at, body`

// fields are a's fields in the order of columns, for Scan.
func (a *Approval) fields() []any {
	return []any{&a.ID, &a.AccountID, &a.Method, &a.Path, &a.Route, &a.IdempotencyKey, &a.Fingerprint, &a.Summary, &a.State,
		&a.RequestedBy, &a.DecidedBy, &a.DecidedAt, &a.ExpiresAt, &a.UsedByOperationID, &a.CreatedAt, &a.Body}
}

// scanOne scans row, of columns, into a; found is false when there was no row.
func scanOne(row *sql.Row, a *Approval) (found bool, err error) {
	err = row.Scan(a.fields()...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// The routes of the approval endpoints (ServeMux paths).
const (
	pathRequest = "/v1/approvals"
	pathGet     = "/v1/approvals/{id}"
	pathApprove = "/v1/approvals/{id}/approve"
	pathDeny    = "/v1/approvals/{id}/deny"
	pathRevoke  = "/v1/approvals/{id}/revoke"
)

// WriteRoutes are the write routes of Routes: asking for an approval, deciding one, granting and revoking. They are the only
// writes an approver key may send (auth.AgentWrites).
func WriteRoutes() []string {
	return []string{pathRequest, pathApprove, pathDeny, pathRevoke, pathGrants, pathGrantRevoke}
}

// Routes are the approval endpoints, keyed by ServeMux pattern; they must be behind auth.Middleware. A gin
// router mounts them with httpserver.Mount.
func (s *Service) Routes() map[string]http.Handler {
	m := map[string]http.Handler{
		"POST " + pathRequest: http.HandlerFunc(s.create),
		"GET " + pathGet:      s.approval(s.get),
		"POST " + pathApprove: s.approval(func(w http.ResponseWriter, r *http.Request) { s.decide(w, r, StateApproved) }),
		"POST " + pathDeny:    s.approval(func(w http.ResponseWriter, r *http.Request) { s.decide(w, r, StateDenied) }),
		"POST " + pathRevoke:  s.approval(func(w http.ResponseWriter, r *http.Request) { s.decide(w, r, StateRevoked) }),
	}
	s.grantRoutes(m)
	return m
}

// approval answers 404 for an {id} no approval can have, before h reads anything.
func (s *Service) approval(h http.HandlerFunc) http.Handler { return withID(idPrefix, "approval", h) }

// withID answers 404 for an {id} that is not an id with prefix, naming resource, before h reads anything.
func withID(prefix, resource string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ids.Valid(prefix, r.PathValue("id")) {
			problem.Write(w, r, problem.NotFound(resource))
			return
		}
		h(w, r)
	})
}

func (s *Service) create(w http.ResponseWriter, r *http.Request) {
	var req Request
	if err := httpjson.DecodeCommand(r, &req); err != nil {
		problem.Write(w, r, err)
		return
	}
	p := auth.From(r.Context())
	b, err := s.bind(r.Context(), p.AccountID, req)
	if err != nil {
		problem.Write(w, r, err)
		return
	}
	s.idem.Handle(w, r, idem.Request{Kind: "approvals.request", Command: b},
		func(ctx context.Context, tx *gorm.DB, _ opstatus.Operation) (idem.Result, error) {
			summary, err := json.Marshal(b.Summary)
			if err != nil {
				return idem.Result{}, fmt.Errorf("approval: summary: %w", err)
			}
			var a Approval
			err = database.SQL(tx).QueryRowContext(ctx, `
INSERT INTO approvals (id, account_id, method, path, route, idempotency_key, fingerprint, summary, state, requested_by, expires_at, body)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, 'pending', $9, $10, $11)
RETURNING `+columns,
				ids.New(idPrefix), p.AccountID, b.Method, b.Path, b.Route, b.IdempotencyKey,
				b.Fingerprint, string(summary), p.Actor(), s.now().Add(s.ttl), b.Body).Scan(a.fields()...)
			if err != nil {
				return idem.Result{}, fmt.Errorf("approval: create: %w", err)
			}
			return idem.Result{Status: http.StatusCreated, Body: a, Resource: &opstatus.Resource{Type: "approval", ID: a.ID},
				Header: http.Header{"Location": {"/v1/approvals/" + a.ID}}}, nil
		})
}

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	a, err := load(r.Context(), s.db, auth.From(r.Context()).AccountID, r.PathValue("id"), false)
	if err != nil {
		problem.Write(w, r, err)
		return
	}
	httpjson.Write(w, r, http.StatusOK, a.shown(s.now()))
}

func load(ctx context.Context, db database.DBTX, accountID, id string, lock bool) (Approval, error) {
	q := `SELECT ` + columns + ` FROM approvals WHERE id = $1 AND account_id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	var a Approval
	found, err := scanOne(db.QueryRowContext(ctx, q, id, accountID), &a)
	if err != nil {
		return Approval{}, fmt.Errorf("approval: load %s: %w", id, err)
	}
	if !found {
		return Approval{}, problem.NotFound("approval")
	}
	return a, nil
}

func (s *Service) decide(w http.ResponseWriter, r *http.Request, to State) {
	var none struct{}
	if err := httpjson.DecodeAction(r, &none); err != nil {
		problem.Write(w, r, err)
		return
	}
	a, err := decide(r.Context(), s.db, auth.From(r.Context()), r.PathValue("id"), to, s.now())
	if err != nil {
		problem.Write(w, r, err)
		return
	}
	httpjson.Write(w, r, http.StatusOK, a)
}

// Decide records p's decision on approval id of p's account: StateApproved or StateDenied for a pending
// approval, StateRevoked for an approved one no write has used yet. It is a declared state: repeating the same
// decision by the same approver returns the approval and changes nothing. The decision's audit record is
// written by the database (approval_events), whatever path changed the row.
//
// Returns problem errors: forbidden unless p is an approver, not_found for another account's approval,
// approval_invalid when p requested it or it expired, invalid_state when it is past that decision.
func Decide(ctx context.Context, db database.Pool, p auth.Principal, id string, to State) (Approval, error) {
	return decide(ctx, db, p, id, to, time.Now())
}

func decide(ctx context.Context, db database.Pool, p auth.Principal, id string, to State, now time.Time) (Approval, error) {
	if p.Role != auth.RoleApprover {
		return Approval{}, problem.New("forbidden", "only a key with role approver can decide approvals")
	}
	from, err := decisionFrom(to)
	if err != nil {
		return Approval{}, err
	}
	var (
		a    Approval
		late error
	)
	err = database.InTx(ctx, db, nil, func(tx *sql.Tx) error {
		var err error
		a, late, err = decideLocked(ctx, tx, p, id, from, to, now)
		return err
	})
	if err == nil && late != nil {
		return Approval{}, late
	}
	return a, err
}

// decisionFrom is the state an approval must be in for decision to: pending for approve and deny, approved for
// revoke.
func decisionFrom(to State) (State, error) {
	switch to {
	case StateApproved, StateDenied:
		return StatePending, nil
	case StateRevoked:
		return StateApproved, nil
	}
	return "", fmt.Errorf("approval: decide: %q is not a decision", to)
}

// decideLocked is decide inside its transaction tx: it locks approval id and moves it from state from to to.
// late, with no error, is the refusal of an approval that ran out before the expiry worker came by: its expiry
// is recorded in tx, and decide refuses once tx commits.
func decideLocked(ctx context.Context, tx database.DBTX, p auth.Principal, id string, from, to State, now time.Time) (a Approval, late error, err error) {
	if a, err = load(ctx, tx, p.AccountID, id, true); err != nil {
		return a, nil, err
	}
	switch {
	case a.RequestedBy == p.Actor():
		return a, nil, problem.New("approval_invalid", "an approval must be decided by a key other than the requester's")
	case a.State == to && a.DecidedBy != nil && *a.DecidedBy == p.Actor():
		return a, nil, nil // the same decision again
	case a.State == StateExpired:
		return a, nil, expiredError(a)
	case a.shown(now).State == StateExpired:
		// The row is locked, so the worker cannot record the expiry too.
		late = expiredError(a)
		err = tx.QueryRowContext(ctx, `UPDATE approvals SET state = $1 WHERE account_id = $2 AND id = $3 RETURNING `+columns,
			string(StateExpired), a.AccountID, a.ID).Scan(a.fields()...)
		return a, late, err
	case a.State != from:
		return a, nil, problem.New("invalid_state", "the approval is already %s", a.State)
	case to == StateRevoked && a.UsedByOperationID != nil:
		return a, nil, problem.New("invalid_state", "the approval was already used by operation %s", *a.UsedByOperationID)
	case !now.Before(a.ExpiresAt):
		return a, nil, expiredError(a)
	}
	// decided_by names the last decision (the revoker, for a revoke); approval_events keeps every one.
	err = tx.QueryRowContext(ctx, `UPDATE approvals SET state = $1, decided_by = $2, decided_at = now()
WHERE account_id = $3 AND id = $4 RETURNING `+columns, string(to), p.Actor(), a.AccountID, a.ID).Scan(a.fields()...)
	return a, nil, err
}

func expiredError(a Approval) error {
	return problem.New("approval_invalid", "the approval expired at %s", a.ExpiresAt.UTC().Format(time.RFC3339)).
		With("approval_id", a.ID)
}

// ListFilter selects the approvals List returns.
type ListFilter struct {
	State State
	// Unexpired keeps those that have not expired; Unused those no write has used yet.
	Unexpired, Unused bool
	// Before, when set, keeps those before it in List's order (the last one of the previous page).
	Before *Cursor
	Limit  int
}

// List returns approvals of account, newest first (on the approvals_account_state index).
func List(ctx context.Context, db database.DBTX, accountID string, f ListFilter) ([]Approval, error) {
	q := `SELECT ` + columns + ` FROM approvals WHERE account_id = $1 AND state = $2`
	args := []any{accountID, string(f.State)}
	if f.Unexpired {
		q += ` AND expires_at > now()`
	}
	if f.Unused {
		q += ` AND used_by_operation_id IS NULL`
	}

	if f.Before != nil {
		q += ` AND (created_at, id) < ($3, $4)`
		args = append(args, f.Before.CreatedAt, f.Before.ID)
	}
	args = append(args, f.Limit)
	q += fmt.Sprintf(` ORDER BY created_at DESC, id DESC LIMIT $%d`, len(args))
	out, err := database.ScanAll(ctx, db, func(a *Approval) []any { return a.fields() }, q, args...)
	if err != nil {
		return nil, fmt.Errorf("approval: list %s: %w", f.State, err)
	}
	return out, nil
}

// Cursor is the place of an approval in List's order.
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// Pending is a pending approval as the inbox shows it: with Alike, how many pending approvals of the account
// (itself included) read the same before their bodies: the same method, path and summary.
type Pending struct {
	Approval
	Alike int
}

// Group is the pending approvals one key asked for one route. The inbox lists groups, not approvals, so that
// however many requests one key sends (55 copies of a deploy, or 55 deploys that differ by a digit), they take
// one place on its first page and the request of another key stays in sight; an account has the few keys its
// operator configured, so the groups are few. Within a group, the approvals with fewest look-alikes come
// first: a request is listed before its copies.
type Group struct {
	// ID names the group (InboxGroup): a SHA-256, in hex, of the requester, the method and the route.
	ID          string
	RequestedBy string
	Method      string
	Route       string
	Count       int
	// Newest is when the newest of the group was requested: the inbox's order.
	Newest time.Time
	// Approvals are the first InboxFilter.PerGroup of the group: fewest look-alikes first, then newest.
	Approvals []Pending
}

// InboxFilter selects the groups Inbox returns.
type InboxFilter struct {
	// Before, when set, keeps the groups after it in Inbox's order (the last group of the previous page): a
	// Cursor of a group is its Newest and its ID.
	Before *Cursor
	// Groups is the length of the page, PerGroup how many approvals of each group it lists.
	Groups, PerGroup int
}

// Inbox returns the pending, unexpired approvals of account in groups (Group), the group with the newest
// request first.
func Inbox(ctx context.Context, db database.DBTX, accountID string, f InboxFilter) ([]Group, error) {
	var before any // NULL: the first page
	beforeID := ""
	if f.Before != nil {
		before, beforeID = f.Before.CreatedAt, f.Before.ID
	}
	type row struct {
		Pending
		GroupID string
		N       int
		Newest  time.Time
	}
	rows, err := database.ScanAll(ctx, db, func(r *row) []any { return append(r.fields(), &r.GroupID, &r.N, &r.Newest) },
		inboxQuery, accountID, before, beforeID, f.Groups, f.PerGroup)
	if err != nil {
		return nil, fmt.Errorf("approval: inbox: %w", err)
	}
	var out []Group
	for _, r := range rows {
		if len(out) == 0 || out[len(out)-1].ID != r.GroupID {
			out = append(out, Group{ID: r.GroupID, RequestedBy: r.RequestedBy, Method: r.Method, Route: r.Route, Count: r.N, Newest: r.Newest})
		}
		g := &out[len(out)-1]
		g.Approvals = append(g.Approvals, r.Pending)
	}
	return out, nil
}

// InboxGroup returns the approvals of one group of the inbox (Group.ID), newest first, limit of them after
// before when it is set.
func InboxGroup(ctx context.Context, db database.DBTX, accountID, groupID string, before *Cursor, limit int) ([]Pending, error) {
	var at any
	id := ""
	if before != nil {
		at, id = before.CreatedAt, before.ID
	}
	out, err := database.ScanAll(ctx, db, (*Pending).fields, inboxGroupQuery, accountID, groupID, at, id, limit)
	if err != nil {
		return nil, fmt.Errorf("approval: inbox group: %w", err)
	}
	return out, nil
}

// fields are p's fields in the order of pendingQuery's columns and alike, for Scan.
func (p *Pending) fields() []any { return append(p.Approval.fields(), &p.Alike) }

// pendingQuery is the inbox's approvals of an account (its one argument): pending and unexpired, each with its
// group and its count of look-alikes. jsonb's text form is one per value, so equal summaries compare equal.
const pendingQuery = `
SELECT ` + columns + `,
       encode(sha256(convert_to(requested_by || ' ' || method || ' ' || route, 'UTF8')), 'hex') AS group_id,
       count(*) OVER (PARTITION BY method, path, summary) AS alike
FROM approvals WHERE account_id = $1 AND state = 'pending' AND expires_at > now()`

// inboxQuery pages the groups of pendingQuery ($1) by their newest request, after the cursor ($2 and $3: its
// time and its group; a NULL time for the first page), the page length ($4), and lists the first approvals of
// each ($5: how many).
const inboxQuery = `
WITH pending AS (` + pendingQuery + `
), page AS (
    SELECT group_id, count(*) AS n, max(created_at) AS newest FROM pending GROUP BY group_id
    HAVING $2::timestamptz IS NULL OR (max(created_at), group_id) < ($2::timestamptz, $3)
    ORDER BY newest DESC, group_id DESC LIMIT $4
), ranked AS (
    SELECT pending.*, page.n, page.newest,
           row_number() OVER (PARTITION BY group_id ORDER BY alike, created_at DESC, id DESC) AS rank
    FROM pending JOIN page USING (group_id)
)
SELECT ` + columns + `, alike, group_id, n, newest FROM ranked WHERE rank <= $5 ORDER BY newest DESC, group_id DESC, rank`

// inboxGroupQuery is one group ($2) of pendingQuery ($1), newest first, after the cursor ($3 and $4, as in
// inboxQuery), limit ($5) of them.
const inboxGroupQuery = `
WITH pending AS (` + pendingQuery + `
)
SELECT ` + columns + `, alike FROM pending
WHERE group_id = $2 AND ($3::timestamptz IS NULL OR (created_at, id) < ($3::timestamptz, $4))
ORDER BY created_at DESC, id DESC LIMIT $5`
