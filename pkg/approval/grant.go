package approval

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// A grant is an approver's authority for a group of an agent's calls: writes of the operation kinds it lists
// that would need an approval, sent by one agent key (and, when AgentRunID is set, by one run of it), at most
// MaxUses of them, until ExpiresAt or until it is revoked. A write names it in Grant-Id instead of an
// Approval-Id; its claim uses one of the grant's uses, in the claim's transaction, and the grant's id is part
// of the attempt's records (the attempt record's grant_id). Its history (granted, used by which operation and
// attempt, revoked) is grant_events, sealed by the audit like approval_events, apart from any write's result.
//
// A grant never stands in for the approval of a write that supersedes an operation whose outcome is unknown
// (SupersedeUnknown): that one needs an approval of its own request, whose card shows the operation it
// supersedes, its last dispatch state and the planned recovery.

// HeaderGrantID is the request header that names the grant a write is sent under.
const HeaderGrantID = "Grant-Id"

// grantPrefix starts every grant id (ids.New).
const grantPrefix = "grt_"

// Bounds of a grant: how many writes, for how long, of how many kinds.
const (
	MaxGrantUses     = 1000
	MaxGrantDuration = 7 * 24 * time.Hour
	maxGrantKinds    = 32
)

// Grant states, as read at a time (Grant.State).
const (
	GrantActive  = "active"
	GrantRevoked = "revoked"
	GrantExpired = "expired"
	GrantUsedUp  = "used_up"
)

// Grant is one grant as GET /v1/grants/{id} shows it.
type Grant struct {
	ID         string  `json:"id"`
	AccountID  string  `json:"-"`
	AgentKeyID string  `json:"agent_key_id"`
	AgentRunID *string `json:"agent_run_id"`
	Kinds      Kinds   `json:"kinds"`
	MaxUses    int     `json:"max_uses"`
	Uses       int     `json:"uses"`
	// State is read, not stored: revoked, else expired, else used_up, else active.
	State           string     `json:"state"`
	ExpiresAt       time.Time  `json:"expires_at"`
	GrantedBy       string     `json:"granted_by"`
	GrantedAt       time.Time  `json:"granted_at"`
	RevokedBy       *string    `json:"revoked_by"`
	RevokedAt       *time.Time `json:"revoked_at"`
	LastOperationID *string    `json:"last_operation_id"`
	LastAttemptID   *string    `json:"last_attempt_id"`
}

// shown is g as callers read it at now, with its State.
func (g Grant) shown(now time.Time) Grant {
	switch {
	case g.RevokedAt != nil:
		g.State = GrantRevoked
	case !now.Before(g.ExpiresAt):
		g.State = GrantExpired
	case g.Uses >= g.MaxUses:
		g.State = GrantUsedUp
	default:
		g.State = GrantActive
	}
	return g
}

// Kinds are the operation kinds a grant covers, stored as a jsonb array.
type Kinds []string

// Scan implements sql.Scanner for the jsonb column.
func (k *Kinds) Scan(v any) error {
	switch b := v.(type) {
	case []byte:
		return json.Unmarshal(b, k)
	case string:
		return json.Unmarshal([]byte(b), k)
	case nil:
		*k = nil
		return nil
	}
	return fmt.Errorf("approval: kinds: cannot scan %T", v)
}

// Value implements driver.Valuer.
func (k Kinds) Value() (driver.Value, error) {
	b, err := json.Marshal([]string(k))
	return string(b), err
}

// GrantRequest is the body of POST /v1/grants.
type GrantRequest struct {
	// AgentKeyID is the key id of the agent key the grant is for (auth.Principal.KeyID; `retrysafe agent show`
	// prints it); AgentRunID, when set, narrows it to one run of that agent (its Agent-Run-Id).
	AgentKeyID string `json:"agent_key_id"`
	AgentRunID string `json:"agent_run_id,omitempty"`
	// Kinds are operation kinds (payments.capture, deploys.create, tickets.create, ...).
	Kinds     []string  `json:"kinds"`
	MaxUses   int       `json:"max_uses"`
	ExpiresAt time.Time `json:"expires_at"`
}

var (
	keyIDPattern = regexp.MustCompile(`^[0-9a-f]{12}$`)
	kindPattern  = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}\.[a-z][a-z0-9_]{0,31}$`)
)

// Validate checks the request's shape; its expiry is checked against the service's clock (checkExpiry).
func (r *GrantRequest) Validate() error {
	var errs []problem.FieldError
	if !keyIDPattern.MatchString(r.AgentKeyID) {
		errs = append(errs, problem.FieldError{Field: "agent_key_id", Message: "must be an agent key's id: 12 lowercase hex digits"})
	}
	if r.AgentRunID != "" && !ids.ValidSent(r.AgentRunID) {
		errs = append(errs, problem.FieldError{Field: "agent_run_id", Message: "must be an Agent-Run-Id: 1 to 128 printable ASCII characters"})
	}
	if len(r.Kinds) == 0 || len(r.Kinds) > maxGrantKinds {
		errs = append(errs, problem.FieldError{Field: "kinds", Message: fmt.Sprintf("must list 1 to %d operation kinds", maxGrantKinds)})
	}
	for i, k := range r.Kinds {
		if !kindPattern.MatchString(k) {
			errs = append(errs, problem.FieldError{Field: fmt.Sprintf("kinds[%d]", i), Message: "must be an operation kind: service.action"})
		}
	}
	if r.MaxUses < 1 || r.MaxUses > MaxGrantUses {
		errs = append(errs, problem.FieldError{Field: "max_uses", Message: fmt.Sprintf("must be 1 to %d", MaxGrantUses)})
	}
	if len(errs) > 0 {
		return problem.Validation(errs...)
	}
	return nil
}

func (r *GrantRequest) checkExpiry(now time.Time) error {
	if !r.ExpiresAt.After(now) || r.ExpiresAt.After(now.Add(MaxGrantDuration)) {
		return problem.Validation(problem.FieldError{Field: "expires_at", Message: "must be in the future, at most 7 days from now"})
	}
	return nil
}

const grantColumns = `id, account_id, agent_key_id, agent_run_id, kinds, max_uses, uses, expires_at, granted_by, granted_at,
revoked_by, revoked_at, last_operation_id, last_attempt_id`

// The routes of the grant endpoints (ServeMux paths).
const (
	pathGrants      = "/v1/grants"
	pathGrant       = "/v1/grants/{id}"
	pathGrantRevoke = "/v1/grants/{id}/revoke"
)

// grantRoutes are the grant endpoints, added to Routes.
func (s *Service) grantRoutes(m map[string]http.Handler) {
	m["POST "+pathGrants] = http.HandlerFunc(s.createGrant)
	m["GET "+pathGrant] = s.grant(s.getGrant)
	m["POST "+pathGrantRevoke] = s.grant(s.revokeGrant)
}

// grant answers 404 for an {id} no grant can have, before h reads anything.
func (s *Service) grant(h http.HandlerFunc) http.Handler { return withID(grantPrefix, "grant", h) }

func (s *Service) createGrant(w http.ResponseWriter, r *http.Request) {
	p := auth.From(r.Context())
	if p.Role != auth.RoleApprover {
		problem.Write(w, r, problem.New("forbidden", "only a key with role approver can grant"))
		return
	}
	var req GrantRequest
	if err := httpjson.DecodeCommand(r, &req); err != nil {
		problem.Write(w, r, err)
		return
	}
	if err := req.checkExpiry(s.now()); err != nil {
		problem.Write(w, r, err)
		return
	}
	s.idem.Handle(w, r, idem.Request{Kind: "grants.create", Command: req},
		func(ctx context.Context, tx *gorm.DB, _ opstatus.Operation) (idem.Result, error) {
			var run *string
			if req.AgentRunID != "" {
				run = &req.AgentRunID
			}
			var g Grant
			err := database.SQL(tx).QueryRowContext(ctx, `
INSERT INTO grants (id, account_id, agent_key_id, agent_run_id, kinds, max_uses, expires_at, granted_by)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8) RETURNING `+grantColumns,
				ids.New(grantPrefix), p.AccountID, req.AgentKeyID, run, Kinds(req.Kinds), req.MaxUses, req.ExpiresAt, p.Actor()).Scan(g.fields()...)
			if err != nil {
				return idem.Result{}, fmt.Errorf("approval: grant: %w", err)
			}
			return idem.Result{Status: http.StatusCreated, Body: g.shown(s.now()), Resource: &opstatus.Resource{Type: "grant", ID: g.ID},
				Header: http.Header{"Location": {"/v1/grants/" + g.ID}}}, nil
		})
}

func (s *Service) getGrant(w http.ResponseWriter, r *http.Request) {
	g, err := loadGrant(r.Context(), s.db, auth.From(r.Context()).AccountID, r.PathValue("id"), false)
	if err != nil {
		problem.Write(w, r, err)
		return
	}
	httpjson.Write(w, r, http.StatusOK, g.shown(s.now()))
}

func (s *Service) revokeGrant(w http.ResponseWriter, r *http.Request) {
	var none struct{}
	if err := httpjson.DecodeAction(r, &none); err != nil {
		problem.Write(w, r, err)
		return
	}
	g, err := RevokeGrant(r.Context(), s.db, auth.From(r.Context()), r.PathValue("id"))
	if err != nil {
		problem.Write(w, r, err)
		return
	}
	httpjson.Write(w, r, http.StatusOK, g.shown(s.now()))
}

// RevokeGrant revokes grant id of p's account: the next write sent under it is refused. Revoking a revoked
// grant returns it unchanged. Its `revoked` record is written by the database (grant_events).
//
// Returns problem errors: forbidden unless p is an approver, not_found for another account's grant.
func RevokeGrant(ctx context.Context, db database.Pool, p auth.Principal, id string) (Grant, error) {
	if p.Role != auth.RoleApprover {
		return Grant{}, problem.New("forbidden", "only a key with role approver can revoke a grant")
	}
	var g Grant
	err := database.InTx(ctx, db, nil, func(tx *sql.Tx) error {
		var err error
		if g, err = loadGrant(ctx, tx, p.AccountID, id, true); err != nil || g.RevokedAt != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `UPDATE grants SET revoked_by = $1, revoked_at = now() WHERE account_id = $2 AND id = $3 RETURNING `+grantColumns,
			p.Actor(), p.AccountID, id).Scan(g.fields()...)
	})
	return g, err
}

func loadGrant(ctx context.Context, db database.DBTX, accountID, id string, lock bool) (Grant, error) {
	q := `SELECT ` + grantColumns + ` FROM grants WHERE account_id = $1 AND id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	var g Grant
	err := db.QueryRowContext(ctx, q, accountID, id).Scan(g.fields()...)
	if errors.Is(err, sql.ErrNoRows) {
		return Grant{}, problem.NotFound("grant")
	}
	if err != nil {
		return Grant{}, fmt.Errorf("approval: load grant %s: %w", id, err)
	}
	return g, nil
}

// fields are g's fields in the order of grantColumns, for Scan.
func (g *Grant) fields() []any {
	return []any{&g.ID, &g.AccountID, &g.AgentKeyID, &g.AgentRunID, &g.Kinds, &g.MaxUses, &g.Uses, &g.ExpiresAt, &g.GrantedBy,
		&g.GrantedAt, &g.RevokedBy, &g.RevokedAt, &g.LastOperationID, &g.LastAttemptID}
}

// grantUse is what a write sent under a grant says: the grant, and the run and attempt that sent it.
type grantUse struct {
	id, run, attempt string
}

func grantUseOf(h http.Header) grantUse {
	return grantUse{id: h.Get(HeaderGrantID), run: h.Get("Agent-Run-Id"), attempt: h.Get(ids.HeaderAttemptID)}
}

// useGrant checks, in the claim transaction of op, that the grant u names covers op (the caller's agent key
// and run, op's kind, not revoked, not expired, a use left) and uses one: the grant's row counts it and its
// `used` record names op and the attempt. A refusal is 403 grant_invalid with the reason.
func (s *Service) useGrant(ctx context.Context, tx database.DBTX, op opstatus.Operation, u grantUse) error {
	refuse := func(reason, detail string) error {
		return problem.New("grant_invalid", "%s", detail).With("grant_id", u.id).With("reason", reason)
	}
	if !ids.Valid(grantPrefix, u.id) {
		return refuse("not_found", "no such grant in this account")
	}
	g, err := loadGrant(ctx, tx, op.AccountID, u.id, true)
	if errors.Is(err, problem.ErrNotFound) {
		return refuse("not_found", "no such grant in this account")
	} else if err != nil {
		return err
	}
	switch g = g.shown(s.now()); {
	case g.AgentKeyID != auth.From(ctx).KeyID:
		return refuse("other_agent", "the grant is for another agent key")
	case g.AgentRunID != nil && *g.AgentRunID != u.run:
		return refuse("other_run", "the grant is for another run of this agent (Agent-Run-Id)")
	case !slices.Contains(g.Kinds, op.Kind):
		return refuse("other_kind", "the grant does not cover writes of kind "+op.Kind)
	case g.State != GrantActive:
		return refuse(g.State, "the grant is "+g.State)
	}
	var attempt *string
	if u.attempt != "" {
		attempt = &u.attempt
	}
	_, err = tx.ExecContext(ctx, `UPDATE grants SET uses = uses + 1, last_operation_id = $1, last_attempt_id = $2, last_kind = $3
WHERE account_id = $4 AND id = $5`, op.ID, attempt, op.Kind, op.AccountID, u.id)
	if err != nil {
		return fmt.Errorf("approval: use grant %s: %w", u.id, err)
	}
	return opstatus.Append(ctx, tx, op.AccountID, op.ID, "grant_checked", "system:grant",
		map[string]any{"grant_id": u.id, "granted_by": g.GrantedBy, "use": g.Uses + 1, "max_uses": g.MaxUses})
}

// GrantUse is one `used` record of a grant: the operation and attempt that used it.
type GrantUse struct {
	GrantID     string
	OperationID string
	AttemptID   string
}

// GrantUses returns the `used` records of grants ids of every account, as grant_events holds them: what an
// agent's journal says it sent under a grant is checked against them (`retrysafe audit verify --journal`).
func GrantUses(ctx context.Context, db database.DBTX, grantIDs []string) ([]GrantUse, error) {
	out, err := database.ScanAll(ctx, db, func(u *GrantUse) []any { return []any{&u.GrantID, &u.OperationID, &u.AttemptID} },
		`SELECT grant_id, detail->>'operation_id' AS operation_id, coalesce(detail->>'attempt_id', '') AS attempt_id
FROM grant_events WHERE grant_id = ANY($1) AND type = 'used' ORDER BY grant_id, id`, grantIDs)
	if err != nil {
		return nil, fmt.Errorf("approval: grant uses: %w", err)
	}
	return out, nil
}

// addRecoveryCard adds to card, the summary's "supersedes" of operation opID, what a person deciding a retry
// after an unknown outcome must see beside its state and last dispatch: its original intent (kind, idempotency
// key, resource) and the planned recovery. A grant never decides this; the approval of this request does.
func addRecoveryCard(card map[string]any, opID string, r opstore.Prior) {
	intent := map[string]any{"kind": r.Kind, "idempotency_key": r.IdempotencyKey}
	if r.ResourceType != "" {
		intent["resource"] = r.ResourceType + " " + r.ResourceID
	}
	card["original_intent"] = intent
	card["planned_recovery"] = "send this request as a new operation that supersedes " + opID + ", which is not sent again; " +
		"if " + opID + " is later found to have happened too, both effects stand and the duplicate is corrected as a new operation"
}
