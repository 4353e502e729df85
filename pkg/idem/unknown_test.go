package idem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// TestUnknownSettledDuringARetryIsNotAnswered202: a retry finds its operation unknown, and while it is being
// answered the operation settles (here its reconciler settles it as failed and still reports an error, as when
// another worker settles it meanwhile). The answer's status and body agree: the settled answer replayed, never
// a 202 "unknown" whose body says failed; and the retry's one record says so.
func TestUnknownSettledDuringARetryIsNotAnswered202(t *testing.T) {
	t.Parallel()
	e := setupExternal(t, 5*time.Second)
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		return "", fmt.Errorf("read: connection reset: %w", idem.ErrOutcomeUnknown)
	}
	e.env.Idem.Reconcilers = map[string]opstatus.Reconciler{
		"test.charge": opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
			err := e.env.Idem.Settle(ctx, op, "system:test", func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
				return idem.ProblemResult(problem.New("provider_declined", "declined"), opstatus.StateFailed), nil
			})
			return errors.Join(err, errors.New("the answer of the other side was lost"))
		}),
	}
	if first := e.post(t, "lost", `{"amount":5}`, "Attempt-Id", "att_first"); first.status != 202 {
		t.Fatalf("lost answer: %d %v", first.status, first.body)
	}
	retry := e.post(t, "lost", `{"amount":5}`, "Attempt-Id", "att_retry")
	if retry.status == 202 || retry.body["code"] != "provider_declined" || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v; want the settled failure replayed", retry.status, retry.body)
	}
	var records []struct{ Type, Outcome string }
	e.env.DB.Raw(`SELECT type, detail->>'outcome' AS outcome FROM operation_events WHERE detail->>'attempt_id' = 'att_retry'`).Scan(&records)
	if len(records) != 1 || records[0].Outcome != "replayed" {
		t.Fatalf("the retry's records: %+v; want one, replayed", records)
	}
}

// TestLateClaimantWithItsOwnAttemptIDDefers: the attempt that claimed an operation outlives its lease; the
// recovery worker settles the operation meanwhile. Its late answer is what the worker stored: its own Attempt-Id
// (sent by the caller, on the operation's claim and the worker's record of it) is not a repeat of another
// attempt's, and the attempt is still recorded once.
func TestLateClaimantWithItsOwnAttemptIDDefers(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	e := setupExternal(t, lease)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	e.effect.call = func(ctx context.Context, op opstatus.Operation) (string, error) {
		entered <- struct{}{}
		<-release
		return "too late", nil
	}
	done := make(chan reply, 1)
	go func() { done <- e.post(t, "hung", `{"amount":5}`, "Attempt-Id", "att_claimant") }()
	<-entered
	e.env.Clock.Advance(lease + time.Second) // past the lease
	worker := &opstatus.RecoveryWorker{DB: e.env.DB.Pool, Logger: e.env.Logger, Clock: e.env.Clock, Reconcilers: map[string]opstatus.Reconciler{
		"test.charge": opstatus.ReconcilerFunc(func(ctx context.Context, op opstatus.Operation) error {
			return e.env.Idem.Settle(ctx, op, "system:test", func(ctx context.Context, tx *gorm.DB) (idem.Result, error) {
				return idem.Result{Status: 200, Body: map[string]any{"operation": op.ID, "outcome": "reconciled"}}, nil
			})
		}),
	}}
	if n, err := worker.RunOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("reconciled %d, %v", n, err)
	}
	close(release)
	late := <-done
	if late.status != 200 || late.body["outcome"] != "reconciled" {
		t.Fatalf("late answer: %d %v; want what the worker stored", late.status, late.body)
	}
	var records int64
	e.env.DB.Raw(`SELECT count(*) FROM operation_events WHERE outcome IS NOT NULL AND attempt_id = 'att_claimant'`).Scan(&records)
	if records != 1 {
		t.Fatalf("%d attempt records of the claimant; want 1", records)
	}
}
