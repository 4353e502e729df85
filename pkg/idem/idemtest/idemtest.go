// Package idemtest is the conformance suite every idem.Store must pass (the river riverdrivertest way): one set
// of behaviours, run against each implementation.
//
//	func TestPostgresStore(t *testing.T) {
//		idemtest.Exercise(t, func(t *testing.T) (idem.Store, *gorm.DB) { return idem.PostgresStore{}, testdb.Schema(t).DB })
//	}
package idemtest

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// NewStore returns a store and a database with the retrysafe schema, empty, owned by the test.
type NewStore func(t *testing.T) (idem.Store, *gorm.DB)

// Exercise runs the suite.
func Exercise(t *testing.T, newStore NewStore) {
	t.Run("ClaimThenConflict", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t)
		ctx := context.Background()
		rec := claimCommitted(t, s, db, "acct", "k1", "fp1")
		if rec.State != idem.KeyRunning || rec.Fingerprint != "fp1" {
			t.Fatalf("claimed record = %+v", rec)
		}
		stored, claimed, err := s.Claim(ctx, db, newOp("acct", "k1", "fp2"), "test", nil)
		if err != nil || claimed {
			t.Fatalf("second claim: claimed=%v err=%v", claimed, err)
		}
		if stored.Fingerprint != "fp1" || stored.OperationID != rec.OperationID || stored.OperationState != opstatus.StateRunning {
			t.Fatalf("second claim returned %+v, want the first record", stored)
		}
		var ops int64
		db.Raw(`SELECT count(*) FROM operations`).Scan(&ops)
		if ops != 1 {
			t.Fatalf("a refused claim created an operation: %d operations", ops)
		}
		op, err := opstatus.Get(ctx, db, "acct", rec.OperationID)
		if err != nil || len(op.Events) != 1 || op.Events[0].Type != opstatus.EventClaimed {
			t.Fatalf("claimed operation = %+v, %v", op, err)
		}
	})

	// The Store owns the insert of operations (see package idem); what Claim writes must read back through
	// opstatus exactly as claimed, or GET /v1/operations would tell a caller something else than the claim.
	t.Run("ClaimedOperationReadsBackThroughOpstatus", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t)
		ctx := context.Background()
		lease := time.Now().Add(time.Minute).Round(time.Microsecond)
		op := newOp("acct", "k-read", "fp-read")
		op.Kind, op.LeaseExpiresAt = "test.external", &lease
		if _, claimed, err := s.Claim(ctx, db, op, "agent:k1", map[string]any{"attempt_id": "att_1"}); err != nil || !claimed {
			t.Fatalf("claim: claimed=%v err=%v", claimed, err)
		}
		got, err := opstatus.Get(ctx, db, "acct", op.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != op.ID || got.Kind != "test.external" || got.State != opstatus.StateRunning || got.IdempotencyKey != "k-read" ||
			got.Fingerprint != "fp-read" || got.LeaseExpiresAt == nil || !got.LeaseExpiresAt.Equal(lease) {
			t.Fatalf("opstatus.Get = %+v, want the claimed operation %+v", got, op)
		}
		if len(got.Events) != 1 || got.Events[0].Type != opstatus.EventClaimed || got.Events[0].Actor != "agent:k1" ||
			got.Events[0].ToState != opstatus.StateRunning {
			t.Fatalf("events = %+v, want one claimed event by agent:k1", got.Events)
		}
		if _, err := opstatus.Get(ctx, db, "other-acct", op.ID); !errors.Is(err, problem.ErrNotFound) {
			t.Fatalf("another account reads the operation: %v", err)
		}
		byKey, err := opstatus.FindByKey(ctx, db, "acct", "k-read")
		if err != nil || len(byKey) != 1 || byKey[0].ID != op.ID {
			t.Fatalf("opstatus.FindByKey = %+v, %v", byKey, err)
		}
	})

	t.Run("KeysAreScopedToAccounts", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t)
		a := claimCommitted(t, s, db, "acct-a", "shared", "fp")
		b := claimCommitted(t, s, db, "acct-b", "shared", "fp")
		if a.OperationID == b.OperationID {
			t.Fatal("two accounts share one claim")
		}
	})

	t.Run("ConcurrentClaimsHaveOneWinner", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t)
		const racers = 20
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			mu    sync.Mutex
			wins  int
			errs  []error
		)
		for range racers {
			wg.Go(func() {
				<-start
				err := db.Transaction(func(tx *gorm.DB) error {
					_, claimed, err := s.Claim(context.Background(), tx, newOp("acct", "race", "fp"), "test", nil)
					if err != nil || !claimed {
						return err
					}
					mu.Lock()
					wins++
					mu.Unlock()
					return nil
				})
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		if wins != 1 || len(errs) != 0 {
			t.Fatalf("wins = %d, errors = %v", wins, errs)
		}
	})

	t.Run("RolledBackClaimFreesTheKey", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t)
		boom := errors.New("write failed")
		err := db.Transaction(func(tx *gorm.DB) error {
			if _, _, err := s.Claim(context.Background(), tx, newOp("acct", "k", "fp"), "test", nil); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatal(err)
		}
		if _, err := s.Lookup(context.Background(), db, "acct", "k"); !errors.Is(err, problem.ErrNotFound) {
			t.Fatalf("lookup after rollback: %v, want not found", err)
		}
		claimCommitted(t, s, db, "acct", "k", "fp")
	})

	t.Run("CompleteStoresTheResponseByteForByte", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t)
		rec := claimCommitted(t, s, db, "acct", "k", "fp")
		body := []byte(`{"b":1,  "a":"ü\u00fc"}`)
		resp := idem.Response{Status: 201, Header: http.Header{"Location": {"/v1/x/1"}}, Body: body}
		done := idem.Completion{AccountID: "acct", Key: "k", OperationID: rec.OperationID, Response: resp,
			State: opstatus.StateSucceeded, Resource: &opstatus.Resource{Type: "x", ID: "1"}, Event: opstatus.EventCompleted, Actor: "test"}
		if err := s.Complete(context.Background(), db, done); err != nil {
			t.Fatal(err)
		}
		got, err := s.Lookup(context.Background(), db, "acct", "k")
		if err != nil {
			t.Fatal(err)
		}
		if got.State != idem.KeyCompleted || got.Response == nil || got.Response.Status != 201 ||
			string(got.Response.Body) != string(body) || got.Response.Header.Get("Location") != "/v1/x/1" {
			t.Fatalf("stored = %+v", got)
		}
		if got.OperationID != rec.OperationID {
			t.Fatal("operation id changed")
		}
		op, err := opstatus.Get(context.Background(), db, "acct", rec.OperationID)
		if err != nil || op.State != opstatus.StateSucceeded || op.Resource == nil || op.Resource.ID != "1" || op.Events[len(op.Events)-1].Type != opstatus.EventCompleted {
			t.Fatalf("operation after complete = %+v, %v", op, err)
		}
		if err := s.Complete(context.Background(), db, done); !errors.Is(err, idem.ErrAlreadySettled) {
			t.Fatalf("completing twice: %v, want ErrAlreadySettled", err)
		}
	})

	t.Run("ReleaseFreesOnlyItsOwnRunningKey", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t)
		ctx := context.Background()
		rec := claimCommitted(t, s, db, "acct", "unsent", "fp")
		if err := s.Release(ctx, db, "acct", "unsent", "op_someone_else"); !errors.Is(err, idem.ErrAlreadySettled) {
			t.Fatalf("release under another operation = %v; want ErrAlreadySettled", err)
		}
		if err := s.Release(ctx, db, "acct", "unsent", rec.OperationID); err != nil {
			t.Fatalf("release: %v", err)
		}
		again := claimCommitted(t, s, db, "acct", "unsent", "fp")
		if again.OperationID == rec.OperationID {
			t.Fatal("the released key was claimed by its old operation")
		}
		done := claimCommitted(t, s, db, "acct", "done", "fp")
		complete(t, s, db, done, opstatus.StateSucceeded)
		if err := s.Release(ctx, db, "acct", "done", done.OperationID); !errors.Is(err, idem.ErrAlreadySettled) {
			t.Fatalf("release of a completed key = %v; want ErrAlreadySettled", err)
		}
	})

	t.Run("PruneKeepsWhatIsStillOwed", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t)
		ctx := context.Background()
		done := claimCommitted(t, s, db, "acct", "done", "fp")
		complete(t, s, db, done, opstatus.StateSucceeded)
		claimCommitted(t, s, db, "acct", "running", "fp")
		unknown := claimCommitted(t, s, db, "acct", "unknown", "fp")
		if _, err := opstatus.Transition(ctx, db, "acct", unknown.OperationID, opstatus.StateUnknown, "test"); err != nil {
			t.Fatal(err)
		}
		queued := claimCommitted(t, s, db, "acct", "queued", "fp")
		complete(t, s, db, queued, opstatus.StateQueued)

		// Nothing is old enough yet.
		if n, err := s.Prune(ctx, db, time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Fatalf("prune of young keys: %d, %v", n, err)
		}
		n, err := s.Prune(ctx, db, time.Now().Add(time.Hour))
		if err != nil || n != 1 {
			t.Fatalf("pruned %d (%v), want only the finished key", n, err)
		}
		for _, key := range []string{"running", "unknown", "queued"} {
			if _, err := s.Lookup(ctx, db, "acct", key); err != nil {
				t.Errorf("%s key was pruned: %v", key, err)
			}
		}
		// The operation and its history outlive the key.
		if _, err := opstatus.Get(ctx, db, "acct", done.OperationID); err != nil {
			t.Errorf("operation of a pruned key: %v", err)
		}
	})
}

func newOp(account, key, fp string) opstatus.Operation {
	return opstatus.Operation{ID: opstatus.NewID(), AccountID: account, Kind: "test", State: opstatus.StateRunning,
		IdempotencyKey: key, Fingerprint: fp}
}

// claimCommitted claims a key and commits, as external mode does.
func claimCommitted(t *testing.T, s idem.Store, db *gorm.DB, account, key, fp string) idem.Record {
	t.Helper()
	rec, claimed, err := s.Claim(context.Background(), db, newOp(account, key, fp), "test", map[string]any{"attempt_id": "att_test"})
	if err != nil || !claimed {
		t.Fatalf("claim %s/%s: claimed=%v err=%v", account, key, claimed, err)
	}
	return rec
}

func complete(t *testing.T, s idem.Store, db *gorm.DB, rec idem.Record, state opstatus.State) {
	t.Helper()
	err := s.Complete(context.Background(), db, idem.Completion{AccountID: rec.AccountID, Key: rec.Key, OperationID: rec.OperationID,
		Response: idem.Response{Status: 200, Body: []byte(`{}`)}, State: state, Event: opstatus.EventCompleted, Actor: "test"})
	if err != nil {
		t.Fatalf("complete %s: %v", rec.Key, err)
	}
}
