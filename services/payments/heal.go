package payments

// Healing from the provider. An asynchronous standby promoted after the primary died loses the commits the
// primary acknowledged in its last seconds: an intent, a capture or a refund the provider executed can vanish from
// our books while the provider keeps it. The provider lists what it executed (GET /v1/effects, each call with its
// key, its answer and its authorization as it stands), and every authorization carries the account in its
// metadata, so the sweep below can tell, for each effect, whether our rows record it, and restore the rows when
// they do not: each restored effect gets an operation of kind KindRestore, succeeded, whose event EventRestored
// says which provider call it rebuilds and why. Where the rows cannot be rebuilt (another active intent holds the
// order, a call the provider executed more than once, an intent that no longer matches the provider) it opens
// an operation of the same kind, unknown, for a person (EventRestoreNeedsPerson), once per effect.
//
// The sweep never races a call in flight: a create, capture, cancel or refund commits its reservation (an
// authorizing intent, a capturing or canceling intent, a pending refund) before its provider call, and the sweep
// leaves every effect alone while such a reservation stands (its handler or reconciler records it).
//
// When it runs: on a schedule (SweepInterval), at once when the database's timeline differs from the one the last
// sweep stored (a promoted standby starts a new timeline), and by `retrysafe payments-sweep`. What it has found
// still different is the gauge retrysafe_provider_unmatched_effects.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/provider"
)

// KindRestore is the operation that restores one provider effect our database lost, or leaves it to a person.
const KindRestore = "payments.restore"

// Events of a restore operation.
const (
	// EventRestored: the rows of a provider effect were rebuilt from the provider's record (restoreDetail).
	EventRestored = "restored"
	// EventRestoreNeedsPerson: the provider executed a call our rows cannot take as it is (restoreDetail.Reason).
	EventRestoreNeedsPerson = "restore_needs_person"
)

// MetadataAccount is the authorization metadata entry that names the account the intent belongs to.
const MetadataAccount = "account_id"

// sweepActor names the sweep in the events it writes.
const sweepActor = "system:payments.sweep"

// restoreDetail is the detail of EventRestored and EventRestoreNeedsPerson.
type restoreDetail struct {
	ProviderKey     string    `json:"provider_key"`
	ProviderKind    string    `json:"provider_kind"`
	AuthorizationID string    `json:"authorization_id"`
	Effects         []string  `json:"effects"`
	ExecutedAt      time.Time `json:"executed_at"`
	Reason          string    `json:"reason"`
	// Timeline is the database timeline the sweep ran on.
	Timeline int64 `json:"timeline"`
}

// Reasons a restore gives.
const (
	reasonLost             = "the provider executed this call and the database has no record of it: the commits that recorded it were lost (a database failover)"
	reasonOrderTaken       = "the intent cannot be restored: another active intent of the account holds its order"
	reasonExecutedTwice    = "the provider executed this call more than once; a person books it (docs/payments.md)"
	reasonStateDiverged    = "the intent's state does not follow from the provider's: a person compares them"
	reasonAccountMissing   = "the authorization names no account"
	effectTypeProviderCall = "provider_effect"
)

// SweepResult counts what one sweep found, per provider effect.
type SweepResult struct {
	// Effects is how many provider effects were compared; Matched those our rows already recorded.
	Effects, Matched int
	// Restored were rebuilt; ForPerson are left to a person (an unknown KindRestore operation); InFlight are
	// reserved by an operation that will record them.
	Restored, ForPerson, InFlight int
	// Timeline is the database's timeline; Failover whether it differs from the one the previous sweep stored.
	Timeline int64
	Failover bool
}

// Unmatched is how many effects our rows do not record after the sweep: ForPerson and InFlight.
func (r SweepResult) Unmatched() int { return r.ForPerson + r.InFlight }

// sweepState is what the last sweep stored (payment_provider_sweep).
type sweepState struct {
	Timeline     int64
	MatchedUntil time.Time
	Found        bool
}

// SweepProvider compares the provider's effects since the last sweep's mark with our rows and heals the
// difference. Concurrent sweeps (replicas) are serialized by the row lock of each intent and by the one
// restore operation per effect.
func (s *Server) SweepProvider(ctx context.Context) (SweepResult, error) {
	state, err := readSweep(ctx, s.db)
	if err != nil {
		return SweepResult{}, err
	}
	timeline, err := currentTimeline(ctx, s.db)
	if err != nil {
		return SweepResult{}, err
	}
	res := SweepResult{Timeline: timeline, Failover: state.Found && timeline != state.Timeline}
	effects, err := s.cfg.Provider.Effects(ctx, state.MatchedUntil)
	if err != nil {
		return res, fmt.Errorf("payments: sweep: list provider effects: %w", err)
	}
	res.Effects = len(effects)
	until := time.Time{}
	for _, group := range byAuthorization(effects) {
		outcomes, err := s.healAuthorization(ctx, group, timeline)
		if err != nil {
			return res, err
		}
		for i, o := range outcomes {
			res.count(o)
			if o != outcomeMatched && o != outcomeRestored && (until.IsZero() || group[i].ExecutedAt.Before(until)) {
				until = group[i].ExecutedAt
			}
		}
	}
	switch {
	case until.IsZero() && len(effects) > 0:
		until = effects[len(effects)-1].ExecutedAt
	case until.IsZero():
		until = state.MatchedUntil
	}
	s.unmatched.Store(int64(res.Unmatched()))
	return res, writeSweep(ctx, s.db, timeline, until)
}

// outcome is what the sweep did with one effect.
type outcome int

const (
	outcomeMatched outcome = iota
	outcomeRestored
	outcomeForPerson
	outcomeInFlight
)

func (r *SweepResult) count(o outcome) {
	switch o {
	case outcomeMatched:
		r.Matched++
	case outcomeRestored:
		r.Restored++
	case outcomeForPerson:
		r.ForPerson++
	case outcomeInFlight:
		r.InFlight++
	}
}

// byAuthorization groups effects by their authorization, each group in execution order (authorize first).
func byAuthorization(effects []provider.Effect) [][]provider.Effect {
	index := map[string]int{}
	var groups [][]provider.Effect
	for _, e := range effects {
		i, ok := index[e.AuthorizationID]
		if !ok {
			i = len(groups)
			index[e.AuthorizationID] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], e)
	}
	return groups
}

// healAuthorization compares the effects on one authorization with our rows, in one transaction holding the
// intent's row lock, and restores or opens what is missing. It returns one outcome per effect.
func (s *Server) healAuthorization(ctx context.Context, group []provider.Effect, timeline int64) ([]outcome, error) {
	a := group[len(group)-1].Authorization
	account := a.Metadata[MetadataAccount]
	outcomes := make([]outcome, len(group))
	if account == "" {
		s.logUnattributed(group)
		for i := range outcomes {
			outcomes[i] = outcomeForPerson
		}
		return outcomes, nil
	}
	tx, err := database.Begin(ctx, s.db)
	if err != nil {
		return nil, err
	}
	defer tx.Close()
	h := &healing{s: s, tx: tx.Gorm(), account: account, auth: a, timeline: timeline, batch: &pgx.Batch{}}
	for i, e := range group {
		if outcomes[i], err = h.effect(ctx, e); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(ctx, h.batch); err != nil {
		return nil, fmt.Errorf("payments: sweep %s: %w", a.ID, err)
	}
	return outcomes, nil
}

func (s *Server) logUnattributed(group []provider.Effect) {
	for _, e := range group {
		s.logger.Warn("provider effect without an account: left to a person", "provider_key", e.Key,
			"kind", e.Kind, "authorization_id", e.AuthorizationID, "reason", reasonAccountMissing)
	}
}

// healing is one authorization's sweep, in one transaction: tx for our rows, batch for the restore operations,
// sent with the COMMIT.
type healing struct {
	s        *Server
	tx       *gorm.DB
	account  string
	auth     provider.Authorization
	timeline int64
	batch    *pgx.Batch
	intent   *Intent // the authorization's intent, once found or restored
}

// effect compares one effect with the rows and heals it.
func (h *healing) effect(ctx context.Context, e provider.Effect) (outcome, error) {
	if len(e.Effects) > 1 {
		return h.forPerson(ctx, e, reasonExecutedTwice)
	}
	if h.intent == nil {
		in, found, err := lockIntentByAuthorization(ctx, h.tx, h.account, e.AuthorizationID)
		if err != nil {
			return 0, err
		}
		if found {
			h.intent = &in
		}
	}
	if h.intent == nil {
		// A lost intent is rebuilt authorized; its capture, void and refunds are then restored from their own
		// effects, each with its operation.
		o, err := h.missingIntent(ctx, e)
		if err != nil || h.intent == nil || e.Kind == provider.KindAuthorize {
			return o, err
		}
	}
	switch e.Kind {
	case provider.KindAuthorize:
		return outcomeMatched, nil
	case provider.KindCapture, provider.KindVoid:
		return h.settledIntent(ctx, e)
	case provider.KindRefund:
		return h.refund(ctx, e)
	}
	return outcomeMatched, nil
}

// missingIntent handles an effect whose authorization no intent of ours names: an authorization in flight
// (an authorizing intent of the order) is left to its create; otherwise the intent is rebuilt from the
// provider's authorization as it stands now, unless another active intent holds the order.
func (h *healing) missingIntent(ctx context.Context, e provider.Effect) (outcome, error) {
	active, found, err := activeIntentOfOrder(ctx, h.tx, h.account, h.auth.Reference)
	switch {
	case err != nil:
		return 0, err
	case found && active.Status == StatusAuthorizing:
		return outcomeInFlight, nil
	case found:
		return h.forPerson(ctx, e, reasonOrderTaken)
	}
	opID := opstatus.NewID()
	in, err := restoreIntent(ctx, h.tx, h.account, opID, h.auth)
	if err != nil {
		return 0, err
	}
	h.intent = &in
	return outcomeRestored, h.restored(ctx, opID, e, "payment_intent", in.ID)
}

// settledIntent handles a capture or void on an intent we have. An intent reserved by a capture or cancel is
// in flight; one still requires_capture is moved to where the provider's authorization stands.
func (h *healing) settledIntent(ctx context.Context, e provider.Effect) (outcome, error) {
	in := h.intent
	switch {
	case in.Status == StatusCapturing || in.Status == StatusCanceling:
		return outcomeInFlight, nil
	case e.Kind == provider.KindCapture && in.Status == StatusSucceeded, e.Kind == provider.KindVoid && in.Status == StatusCanceled:
		return outcomeMatched, nil
	case in.Status != StatusRequiresCapture || h.auth.Status != providerStatusOf(e.Kind):
		return h.forPerson(ctx, e, reasonStateDiverged)
	}
	opID := opstatus.NewID()
	restored, err := restoreSettlement(ctx, h.tx, h.account, in.ID, h.auth.CapturedMinor, e.Kind == provider.KindVoid)
	if err != nil {
		return 0, err
	}
	h.intent = &restored
	return outcomeRestored, h.restored(ctx, opID, e, "payment_intent", in.ID)
}

// providerStatusOf is the authorization status a capture or a void leaves.
func providerStatusOf(k provider.Kind) string {
	if k == provider.KindVoid {
		return provider.StatusVoided
	}
	return provider.StatusCaptured
}

// refund handles a refund the provider paid: matched by its provider id; in flight while the intent has a pending
// refund; otherwise restored as a succeeded refund added to the intent's refunded total.
func (h *healing) refund(ctx context.Context, e provider.Effect) (outcome, error) {
	known, pending, err := refundKnown(ctx, h.tx, h.account, h.intent.ID, e.Effects[0])
	switch {
	case err != nil:
		return 0, err
	case known:
		return outcomeMatched, nil
	case pending:
		return outcomeInFlight, nil
	case h.intent.Status != StatusSucceeded:
		return h.forPerson(ctx, e, reasonStateDiverged)
	}
	var paid provider.Refund
	if err := (provider.LookupResult{Found: true, Status: e.Status, Body: e.Body}).Answer(&paid); err != nil {
		return h.forPerson(ctx, e, reasonStateDiverged)
	}
	opID := opstatus.NewID()
	rf, err := restoreRefund(ctx, h.tx, h.account, opID, *h.intent, paid)
	if err != nil {
		return 0, err
	}
	return outcomeRestored, h.restored(ctx, opID, e, "refund", rf.ID)
}

// restored records that e was restored (payment_restored_effects, for a retry of the lost request to adopt) and
// queues its succeeded restore operation, naming what it rebuilt.
func (h *healing) restored(ctx context.Context, opID string, e provider.Effect, resourceType, resourceID string) error {
	if err := recordRestored(ctx, h.tx, h.account, e.Key, opID, resourceType, resourceID); err != nil {
		return err
	}
	op := opstore.New{ID: opID, AccountID: h.account, Kind: KindRestore, State: string(opstatus.StateSucceeded),
		ResourceType: &resourceType, ResourceID: &resourceID}
	return opstore.QueueCreate(h.batch, op, []opstore.NewEvent{{Type: EventRestored, To: string(opstatus.StateSucceeded),
		Actor: sweepActor, Detail: h.detail(e, reasonLost)}})
}

// forPerson opens, once per effect, an unknown restore operation that names the effect for a person.
func (h *healing) forPerson(ctx context.Context, e provider.Effect, reason string) (outcome, error) {
	typ, id := effectTypeProviderCall, e.Effects[0]
	existing, err := opstore.ForResource(ctx, database.SQL(h.tx), h.account, KindRestore, typ, id)
	if err != nil || existing != "" {
		return outcomeForPerson, err
	}
	op := opstore.New{ID: opstatus.NewID(), AccountID: h.account, Kind: KindRestore, State: string(opstatus.StateUnknown),
		ResourceType: &typ, ResourceID: &id}
	return outcomeForPerson, opstore.QueueCreate(h.batch, op, []opstore.NewEvent{{Type: EventRestoreNeedsPerson,
		To: string(opstatus.StateUnknown), Actor: sweepActor, Detail: h.detail(e, reason)}})
}

func (h *healing) detail(e provider.Effect, reason string) restoreDetail {
	return restoreDetail{ProviderKey: e.Key, ProviderKind: string(e.Kind), AuthorizationID: e.AuthorizationID,
		Effects: slices.Clone(e.Effects), ExecutedAt: e.ExecutedAt, Reason: reason, Timeline: h.timeline}
}

// SweepWorker runs SweepProvider every Interval, and at once when the database's timeline changes (checked every
// Check): a promoted standby is on a new timeline.
type SweepWorker struct {
	Server          *Server
	Interval, Check time.Duration
	Logger          *slog.Logger
}

// Run sweeps until ctx ends.
func (w *SweepWorker) Run(ctx context.Context) {
	var lastTimeline int64
	due := time.Now()
	tick := time.NewTicker(w.Check)
	defer tick.Stop()
	for {
		timeline, err := currentTimeline(ctx, w.Server.db)
		changed := err == nil && lastTimeline != 0 && timeline != lastTimeline
		if err == nil {
			lastTimeline = timeline
		}
		if changed || !time.Now().Before(due) {
			res, err := w.Server.SweepProvider(ctx)
			w.log(res, err)
			due = time.Now().Add(w.Interval)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (w *SweepWorker) log(res SweepResult, err error) {
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		w.Logger.Warn("provider sweep failed; the next one looks again", "error", err)
	case res.Failover || res.Restored > 0 || res.Unmatched() > 0:
		w.Logger.Warn("provider sweep", "timeline", res.Timeline, "failover", res.Failover, "effects", res.Effects,
			"restored", res.Restored, "for_person", res.ForPerson, "in_flight", res.InFlight)
	}
}
