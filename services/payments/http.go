package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/services/provider"
)

// Config configures the payments service; cmd/retrysafe fills it from the environment.
type Config struct {
	// Store is PostgresStore when nil.
	Store Store
	// Provider is the payment provider's client (required).
	Provider Provider
	// ApprovalThresholds maps a currency to the amount, in minor units, above which a capture or a refund needs
	// a person's approval; for refunds the amount is the intent's running total of refunds. A currency missing
	// from the map needs approval for any amount above zero: the rule fails closed.
	ApprovalThresholds map[string]int64
	// ApprovalTTL is how long an approval may be used after it is requested (required).
	ApprovalTTL time.Duration
	// SweepInterval is how often the provider sweep (heal.go) runs, SweepCheck how often the database's
	// timeline is read to sweep at once after a failover. Zero leaves the sweep worker out.
	SweepInterval, SweepCheck time.Duration
}

// Server is the payments service: its HTTP adapter, reconcilers and approvals.
type Server struct {
	cfg       Config
	db        *gorm.DB
	idem      *idem.Handler
	approvals *approval.Service
	logger    *slog.Logger
	// unmatched is how many provider effects the last sweep of this process left unmatched.
	unmatched atomic.Int64
}

// New returns the payments service after checking cfg.
func New(d service.Deps, cfg Config) (*Server, error) {
	switch {
	case d.DB == nil || d.Idem == nil:
		return nil, errors.New("payments: Deps.DB and Deps.Idem are required")
	case cfg.Provider == nil:
		return nil, errors.New("payments: Config.Provider is required")
	case cfg.ApprovalTTL <= 0:
		return nil, errors.New("payments: Config.ApprovalTTL must be positive")
	}
	if cfg.Store == nil {
		cfg.Store = PostgresStore{}
	}
	s := &Server{cfg: cfg, db: d.DB, idem: d.Idem, logger: d.Log()}
	if d.Metrics != nil {
		// One payments service per process: a second one on the same registry (a test's replicas) is not reported.
		_ = d.Metrics.Registry().Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "retrysafe_provider_unmatched_effects",
			Help: "Provider effects the last payments sweep of this process found without their rows: left to a person, or in flight.",
		}, func() float64 { return float64(s.unmatched.Load()) }))
	}
	s.approvals = approval.New(d.Pool, d.Idem, cfg.ApprovalTTL,
		approval.Route{Method: http.MethodPost, Path: routeCapture, Describe: s.describeCapture},
		approval.Route{Method: http.MethodPost, Path: routeRefunds, Describe: s.describeRefund},
	)
	return s, nil
}

var _ service.Service = (*Server)(nil)

// Name implements service.Service.
func (s *Server) Name() string { return "payments" }

// Workers implements service.Service: the provider sweep (heal.go), when configured; the recovery worker runs
// the reconcilers.
func (s *Server) Workers() []service.Worker {
	if s.cfg.SweepInterval <= 0 {
		return nil
	}
	check := s.cfg.SweepCheck
	if check <= 0 {
		check = s.cfg.SweepInterval
	}
	w := &SweepWorker{Server: s, Interval: s.cfg.SweepInterval, Check: check, Logger: s.logger}
	return []service.Worker{{Name: "payments-sweep", Run: w.Run}}
}

// needsApproval reports whether moving minor units of currency needs a person's approval. An unlisted
// currency has the threshold zero.
func (s *Server) needsApproval(currency string, minor int64) bool {
	return minor > s.cfg.ApprovalThresholds[currency]
}

// reconcilerActor names the reconciler in the events it writes.
const reconcilerActor = "system:payments.reconciler"

// unknown marks a provider answer that was lost or late, for idem to leave the operation unknown.
func unknown(err error) error {
	if errors.Is(err, provider.ErrOutcomeUnknown) {
		return fmt.Errorf("%w: %w", idem.ErrOutcomeUnknown, err)
	}
	return err
}

// callContext bounds a provider call by the operation's lease, on the clock the lease counts by (the idem
// handler's): once the lease is over the reconciler may conclude from an empty lookup that the call never
// executed, so the call must not start or run after it. Every keyed call made with it is recorded in the
// operation's history (dispatchRecorder).
func (s *Server) callContext(ctx context.Context, op opstatus.Operation) (context.Context, context.CancelFunc) {
	ctx = provider.WithDispatchObserver(ctx, dispatchRecorder{db: s.db, accountID: op.AccountID, opID: op.ID, actor: "system:payments", s: s})
	if op.LeaseExpiresAt == nil {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, op.LeaseExpiresAt.Sub(s.idem.Clock.Now()))
}

// downstreamKey is op's provider Idempotency-Key: DownstreamKey, unless the caller's key was given up at the end of
// its lifetime by an earlier operation, when the same key names a new action and so a new provider call (the
// provider would replay the earlier call's answer, and the books would record an effect it never made).
func (s *Server) downstreamKey(ctx context.Context, op opstatus.Operation) (string, error) {
	return downstreamKeyIn(ctx, s.db, op)
}

// downstreamKeyIn is downstreamKey read on db: a claim's transaction reads it on its own connection.
func downstreamKeyIn(ctx context.Context, db *gorm.DB, op opstatus.Operation) (string, error) {
	predecessor, err := opstore.KeyPredecessor(ctx, database.SQL(db), op.AccountID, op.IdempotencyKey, op.ID)
	if err != nil {
		return "", err
	}
	return downstreamKeyAfter(op, predecessor), nil
}

// send calls the provider with op's provider key; when the key cannot be read nothing is sent.
func send[T any](ctx context.Context, s *Server, op opstatus.Operation, call func(ctx context.Context, key string) (T, error)) (T, error) {
	ctx, cancel := s.callContext(ctx, op)
	defer cancel()
	key, err := s.downstreamKey(ctx, op)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%w: %w", idem.ErrNotSent, err)
	}
	out, err := call(ctx, key)
	return out, unknown(err)
}

// --- create ---

func (s *Server) createIntent(c *gin.Context) {
	var req CreateIntentRequest
	if err := httpjson.Decode(c.Request, &req); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	cmd, err := req.Command()
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	account := auth.From(c.Request.Context()).AccountID
	var adopted bool
	idemgin.DoExternal(s.idem, c, idem.Request{Kind: KindCreateIntent, Command: cmd}, idem.ExternalSteps[provider.Authorization]{
		Prepare: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error {
			var err error
			if adopted, err = s.adoptRestored(ctx, tx, op); adopted || err != nil {
				return err
			}
			_, err = s.cfg.Store.BeginIntent(ctx, tx, account, op.ID, cmd)
			if pe, ok := errors.AsType[*problem.Error](err); ok && pe.Code == "order_has_active_intent" {
				// A sweep that committed the restored intent while this insert waited on it: adopt it.
				var aerr error
				if adopted, aerr = s.adoptRestored(ctx, tx, op); adopted || aerr != nil {
					return aerr
				}
			}
			return err
		},
		Call: func(ctx context.Context, op opstatus.Operation) (provider.Authorization, error) {
			if adopted {
				return provider.Authorization{}, nil
			}
			return send(ctx, s, op, func(ctx context.Context, key string) (provider.Authorization, error) {
				// The reference is part of what the provider compares under one key, so it is the order, which a
				// retry of the request repeats, and never the operation, which a retry may not share.
				// The account goes with the authorization so that the sweep (heal.go) can rebuild a lost intent.
				return s.cfg.Provider.Authorize(ctx, key, provider.AuthorizeRequest{
					AmountMinor: cmd.AmountMinor, Currency: cmd.Currency, Reference: cmd.OrderID,
					Metadata: map[string]string{MetadataAccount: account},
				})
			})
		},
		Record: s.recordCreate,
	})
}

// --- capture ---

// captureCommand turns a capture body into its command; the handler and the approval's Describe share it so
// the fingerprint an approver binds is the one the write computes.
func (s *Server) captureCommand(ctx context.Context, account, intentID string, req CaptureRequest) (Capture, Intent, error) {
	in, err := s.cfg.Store.Intent(ctx, s.db, account, intentID)
	if err != nil {
		return Capture{}, Intent{}, err
	}
	cmd, err := req.Command(in)
	return cmd, in, err
}

func (s *Server) describeCapture(ctx context.Context, account string, params map[string]string, body json.RawMessage) (any, map[string]any, error) {
	var req CaptureRequest
	if err := httpjson.DecodeBytes(body, &req); err != nil {
		return nil, nil, err
	}
	cmd, in, err := s.captureCommand(ctx, account, params["id"], req)
	if err != nil {
		return nil, nil, err
	}
	return cmd, map[string]any{
		"action": "capture", "intent_id": in.ID, "order_id": in.OrderID, "currency": cmd.Currency,
		"amount": format(cmd.Currency, cmd.AmountMinor), "amount_minor": cmd.AmountMinor, "description": in.Description,
		// Who is paid, and from what: the approver decides on a movement of money, not on an id.
		"paid_to": "account " + account, "paid_from": payerCard(in),
	}, nil
}

// payerCard names, for an approval card, the card the intent's payer authorized at the provider.
func payerCard(in Intent) string {
	if in.ProviderAuthorizationID == nil {
		return "the payer's card (not authorized at the provider)"
	}
	return "the payer's card, provider authorization " + *in.ProviderAuthorizationID
}

func (s *Server) capture(c *gin.Context) {
	var req CaptureRequest
	if err := httpjson.DecodeAction(c.Request, &req); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	account, intentID := auth.From(c.Request.Context()).AccountID, c.Param("id")
	cmd, _, err := s.captureCommand(c.Request.Context(), account, intentID, req)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	var (
		reserved Intent
		adopted  bool
	)
	idemgin.DoExternal(s.idem, c, idem.Request{
		Kind: KindCapture, Command: cmd, Guard: s.approvals.Guard(c.Request.Header, s.needsApproval(cmd.Currency, cmd.AmountMinor)),
		SupersedeUnknown: s.approvals.SupersedeUnknown(c.Request.Header), Takes: []string{approval.HeaderApprovalID},
	}, idem.ExternalSteps[provider.Capture]{
		Prepare: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error {
			var err error
			if adopted, err = s.adoptRestored(ctx, tx, op); adopted || err != nil {
				return err
			}
			reserved, err = s.cfg.Store.BeginCapture(ctx, tx, account, intentID, op.ID)
			return err
		},
		Call: func(ctx context.Context, op opstatus.Operation) (provider.Capture, error) {
			if adopted {
				return provider.Capture{}, nil
			}
			return send(ctx, s, op, func(ctx context.Context, key string) (provider.Capture, error) {
				return s.cfg.Provider.Capture(ctx, key, *reserved.ProviderAuthorizationID, cmd.AmountMinor)
			})
		},
		Record: s.recordCapture,
	})
}

// --- cancel ---

func (s *Server) cancel(c *gin.Context) {
	var req CancelRequest
	if err := httpjson.DecodeAction(c.Request, &req); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	account, intentID := auth.From(c.Request.Context()).AccountID, c.Param("id")
	var (
		reserved Intent
		adopted  bool
	)
	idemgin.DoExternal(s.idem, c, idem.Request{Kind: KindCancel, Command: Cancel{}}, idem.ExternalSteps[provider.Authorization]{
		Prepare: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error {
			var err error
			if adopted, err = s.adoptRestored(ctx, tx, op); adopted || err != nil {
				return err
			}
			reserved, err = s.cfg.Store.BeginCancel(ctx, tx, account, intentID, op.ID)
			return err
		},
		Call: func(ctx context.Context, op opstatus.Operation) (provider.Authorization, error) {
			if adopted {
				return provider.Authorization{}, nil
			}
			return send(ctx, s, op, func(ctx context.Context, key string) (provider.Authorization, error) {
				return s.cfg.Provider.Void(ctx, key, *reserved.ProviderAuthorizationID)
			})
		},
		Record: s.recordCancel,
	})
}

// --- refunds ---

func (s *Server) refundCommand(ctx context.Context, account, intentID string, req CreateRefundRequest) (CreateRefund, Intent, error) {
	in, err := s.cfg.Store.Intent(ctx, s.db, account, intentID)
	if err != nil {
		return CreateRefund{}, Intent{}, err
	}
	cmd, err := req.Command(in)
	return cmd, in, err
}

func (s *Server) describeRefund(ctx context.Context, account string, params map[string]string, body json.RawMessage) (any, map[string]any, error) {
	var req CreateRefundRequest
	if err := httpjson.DecodeBytes(body, &req); err != nil {
		return nil, nil, err
	}
	cmd, in, err := s.refundCommand(ctx, account, params["id"], req)
	if err != nil {
		return nil, nil, err
	}
	held, err := s.cfg.Store.RefundsHeld(ctx, s.db, account, in.ID)
	if err != nil {
		return nil, nil, err
	}
	return cmd, map[string]any{
		"action": "refund", "intent_id": in.ID, "order_id": in.OrderID, "currency": cmd.Currency,
		"amount": format(cmd.Currency, cmd.AmountMinor), "amount_minor": cmd.AmountMinor, "reason": cmd.Reason,
		"description": in.Description, "paid_to": "the payer of order " + in.OrderID + ": " + payerCard(in),
		"paid_from": "account " + account,
		// What the approver weighs: the refunds before this one, and the total with it.
		"refunded_before": format(cmd.Currency, held), "refunded_total": format(cmd.Currency, held+cmd.AmountMinor),
	}, nil
}

// refundNeedsApproval decides, in the claim's transaction, whether the refund cmd needs a person's approval. The
// threshold applies to the intent's running total of refunds, so splitting a large refund into small ones does
// not avoid approval. The total is read under the intent's row lock, which every refund reservation takes: two
// small refunds sent at once cannot both see the total without the other.
func (s *Server) refundNeedsApproval(account, intentID string, cmd CreateRefund) func(ctx context.Context, tx *gorm.DB) (bool, error) {
	return func(ctx context.Context, tx *gorm.DB) (bool, error) {
		held, err := s.cfg.Store.RefundsHeld(ctx, tx, account, intentID)
		if err != nil {
			return false, err
		}
		return s.needsApproval(cmd.Currency, held+cmd.AmountMinor), nil
	}
}

func (s *Server) createRefund(c *gin.Context) {
	var req CreateRefundRequest
	if err := httpjson.Decode(c.Request, &req); err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	account, intentID := auth.From(c.Request.Context()).AccountID, c.Param("id")
	remediates, err := remediatesHeader(c.Request.Header)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	cmd, _, err := s.refundCommand(c.Request.Context(), account, intentID, req)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	needed := s.refundNeedsApproval(account, intentID, cmd)
	var (
		reserved Intent
		adopted  bool
	)
	idemgin.DoExternal(s.idem, c, idem.Request{
		Kind: KindRefund, Command: cmd, Guard: s.approvals.GuardWhen(c.Request.Header, needed), SupersedeUnknown: s.approvals.SupersedeUnknown(c.Request.Header),
		Takes: []string{approval.HeaderApprovalID, HeaderRemediates},
	}, idem.ExternalSteps[provider.Refund]{
		Prepare: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) error {
			var err error
			if adopted, err = s.adoptRestored(ctx, tx, op); adopted || err != nil {
				return err
			}
			reserve := s.cfg.Store.ReserveRefund
			if remediates != "" {
				if err := s.remediate(ctx, tx, account, intentID, remediates, cmd.AmountMinor, op, auth.From(c.Request.Context()).Actor()); err != nil {
					return err
				}
				reserve = s.cfg.Store.ReserveDuplicateRefund
			}
			_, reserved, err = reserve(ctx, tx, account, intentID, op.ID, cmd)
			return err
		},
		Call: func(ctx context.Context, op opstatus.Operation) (provider.Refund, error) {
			if adopted {
				return provider.Refund{}, nil
			}
			return send(ctx, s, op, func(ctx context.Context, key string) (provider.Refund, error) {
				return s.cfg.Provider.Refund(ctx, key, *reserved.ProviderAuthorizationID, cmd.AmountMinor)
			})
		},
		Record: s.recordRefund,
	})
}

// --- reads ---

func (s *Server) getIntent(c *gin.Context) {
	in, err := s.cfg.Store.Intent(c.Request.Context(), s.db, auth.From(c.Request.Context()).AccountID, c.Param("id"))
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, in)
}

func (s *Server) listRefunds(c *gin.Context) {
	p, err := page.FromQuery(c.Request.URL.Query())
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	rs, err := s.cfg.Store.Refunds(c.Request.Context(), s.db, auth.From(c.Request.Context()).AccountID, c.Param("id"), p)
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, page.Of(rs, p, func(r Refund) page.Cursor { return page.Cursor{At: r.CreatedAt, ID: r.ID} }))
}

func (s *Server) getRefund(c *gin.Context) {
	rf, err := s.cfg.Store.Refund(c.Request.Context(), s.db, auth.From(c.Request.Context()).AccountID, c.Param("id"))
	if err != nil {
		httpserver.WriteProblem(c, err)
		return
	}
	httpserver.JSON(c, http.StatusOK, rf)
}
