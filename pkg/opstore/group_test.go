package opstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// attemptDetail is the detail of an attempt record (audit.IsAttempt), of an attempt id never used before (an
// operation has one record per attempt id); evidence is one of an event that is not.
func attemptDetail() opstore.Attempt {
	status := 201
	return opstore.Attempt{AttemptID: fmt.Sprintf("att_%d", attemptIDs.Add(1)), Outcome: "replayed", Status: &status}
}

var attemptIDs atomic.Int64

func evidence(n int) map[string]any { return map[string]any{"evidence": n} }

// appendConcurrently appends n events to every operation of ops, each from a goroutine of its own, all started
// at once: attempt records, but every third. It returns the first error.
func appendConcurrently(ctx context.Context, g *opstore.GroupAppender, ops []opstatus.Operation, n int) error {
	start := make(chan struct{})
	errs := make(chan error, len(ops)*n)
	var wg sync.WaitGroup
	for _, op := range ops {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var detail any
				if i%3 == 2 {
					detail = evidence(i)
				} else {
					detail = attemptDetail()
				}
				errs <- g.Append(ctx, op.AccountID, op.ID, opstore.EventReplayed, "agent:a", detail)
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

type historyRow struct {
	ID      int64
	Seq     int64
	Attempt *int64
}

// checkHistory checks op's history as its readers see it (operation_events_numbered): want records in all, numbered
// 1, 2, ... in id order, and its attempt records numbered 1, 2, ... in that order.
func checkHistory(t *testing.T, db *gorm.DB, op opstatus.Operation, want int) {
	t.Helper()
	var rows []historyRow
	if err := db.Raw(`SELECT id, seq, attempt FROM operation_events_numbered
WHERE account_id = ? AND operation_id = ? ORDER BY id`, op.AccountID, op.ID).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if len(rows) != want {
		t.Fatalf("%s: %d records; want %d", op.ID, len(rows), want)
	}
	var attempts int64
	for i, r := range rows {
		if r.Seq != int64(i+1) {
			t.Fatalf("%s: record %d by id (id %d) has seq %d", op.ID, i+1, r.ID, r.Seq)
		}
		if r.Attempt != nil {
			attempts++
			if *r.Attempt != attempts {
				t.Fatalf("%s: record %d is attempt %d; want %d", op.ID, i+1, *r.Attempt, attempts)
			}
		}
	}
}

// TestGroupAppenderConcurrentAppends: appends to several operations at once, between records written one at a
// time, leave every history whole, in id order, with its attempts numbered on in the records the groups wrote and
// in those written after; and the records seal intact.
func TestGroupAppenderConcurrentAppends(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	var ops []opstatus.Operation
	for range 6 {
		op := create(t, db, opstatus.StateSucceeded, nil)
		// An attempt written alone: the group's numbering continues from it.
		if err := opstatus.Append(ctx, db.Pool, op.AccountID, op.ID, opstore.EventReplayed, "agent:a", attemptDetail()); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	g := &opstore.GroupAppender{DB: db.Pool, Lanes: 2}
	if err := appendConcurrently(ctx, g, ops, 20); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if err := opstatus.Append(ctx, db.Pool, op.AccountID, op.ID, opstore.EventReplayed, "agent:a", attemptDetail()); err != nil {
			t.Fatal(err)
		}
	}
	if err := testdb.AuditIntact(db.DB); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		checkHistory(t, db.DB, op, 1+1+20+1) // claimed, the single attempt, the group's, a single one again
	}
}

// TestTwoGroupAppendersShareOperations: two GroupAppenders (two replicas of a service) and a writer of single
// statements, appending to the same operations at once, never wait on each other, and the histories stay whole.
func TestTwoGroupAppendersShareOperations(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ops []opstatus.Operation
	var accounts, ids []string
	for range 5 {
		op := create(t, db, opstatus.StateSucceeded, nil)
		ops, accounts, ids = append(ops, op), append(accounts, op.AccountID), append(ids, op.ID)
	}
	// One lane each: every group holds records of several operations, and the two replicas' groups overlap.
	replicas := []*opstore.GroupAppender{{DB: db.Pool, Lanes: 1, MaxGroup: 8}, {DB: db.Pool, Lanes: 1, MaxGroup: 8}}
	const singleStatements = 40
	errs := make([]error, len(replicas)+1)
	var wg sync.WaitGroup
	for i, g := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = appendConcurrently(ctx, g, ops, 24)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range singleStatements {
			// A record on every operation, in one statement.
			_, err := db.Statement.ConnPool.ExecContext(ctx, `INSERT INTO operation_events (operation_id, account_id, type, actor, detail)
SELECT v.id, v.account_id, 'replayed', 'agent:b', jsonb_build_object('attempt_id', 'att_b' || $3::text, 'outcome', 'replayed')
FROM unnest($1::text[], $2::text[]) AS v(account_id, id) ORDER BY v.id COLLATE "C"`, accounts, ids, fmt.Sprint(i))
			if err != nil {
				errs[len(replicas)] = err
				return
			}
		}
	}()
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err) // a deadlock is an error (40P01), a wait without end the context's
		}
	}
	if err := testdb.AuditIntact(db.DB); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		checkHistory(t, db.DB, op, 1+2*24+singleStatements)
	}
}

// TestGroupWithUnknownOperationWritesNothing: a group that names an operation that does not exist fails whole,
// for every event in it: no record of the other operations is written.
func TestGroupWithUnknownOperationWritesNothing(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	a, b := create(t, db, opstatus.StateSucceeded, nil), create(t, db, opstatus.StateSucceeded, nil)
	type snapshot struct{ Records, IDSum int64 }
	state := func() (s snapshot) {
		if err := db.Raw(`SELECT count(*) AS records, sum(id) AS id_sum FROM operation_events`).Scan(&s).Error; err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := state()
	g := &opstore.GroupAppender{DB: db.Pool}
	for _, ghost := range []opstore.GroupEvent{
		{AccountID: a.AccountID, ID: "op_missing", Type: opstore.EventReplayed, Actor: "agent:a", Detail: attemptDetail()},
		{AccountID: "acct_other", ID: b.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: attemptDetail()},
	} {
		_, err := g.AppendGroup(ctx, []opstore.GroupEvent{
			{AccountID: a.AccountID, ID: a.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: attemptDetail()},
			ghost,
			{AccountID: b.AccountID, ID: b.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: evidence(1)},
		})
		if err == nil {
			t.Fatalf("a group with an event of %s/%s was written", ghost.AccountID, ghost.ID)
		}
		if after := state(); after != before {
			t.Fatalf("a refused group changed the records from %+v to %+v", before, after)
		}
	}
	// The same group without the ghost is written.
	_, err := g.AppendGroup(ctx, []opstore.GroupEvent{
		{AccountID: a.AccountID, ID: a.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: attemptDetail()},
		{AccountID: b.AccountID, ID: b.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: evidence(1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, db.DB, a, 2)
	checkHistory(t, db.DB, b, 2)
}

// TestGroupRefusesARepeatedAttemptAlone: the database keeps one attempt record per attempt id and operation
// (operation_events_attempt). A group in which one record repeats an attempt id (of the group, or one recorded
// before) writes the others, and refuses only the repeats, with AttemptUsed. An event that is not an attempt
// record may name the id again.
func TestGroupRefusesARepeatedAttemptAlone(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	a, b := create(t, db, opstatus.StateSucceeded, nil), create(t, db, opstatus.StateSucceeded, nil)
	first := attemptDetail()
	if err := opstatus.Append(ctx, db.Pool, a.AccountID, a.ID, opstore.EventReplayed, "agent:a", first); err != nil {
		t.Fatal(err)
	}
	if err := opstatus.Append(ctx, db.Pool, a.AccountID, a.ID, opstore.EventReplayed, "agent:a", first); !opstore.AttemptUsed(err) {
		t.Fatalf("a second record of %v: %v; want AttemptUsed", first.AttemptID, err)
	}
	again := attemptDetail()
	g := &opstore.GroupAppender{DB: db.Pool}
	refused, err := g.AppendGroup(ctx, []opstore.GroupEvent{
		{AccountID: a.AccountID, ID: a.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: first},
		{AccountID: a.AccountID, ID: a.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: again},
		{AccountID: a.AccountID, ID: a.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: again},
		{AccountID: b.AccountID, ID: b.ID, Type: opstore.EventReplayed, Actor: "agent:a", Detail: first}, // another operation
		{AccountID: a.AccountID, ID: a.ID, Type: opstore.EventSuperseded, Actor: "agent:a", Detail: opstore.Link{AttemptID: first.AttemptID}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, true, false, false} {
		if opstore.AttemptUsed(refused[i]) != want || (!want && refused[i] != nil) {
			t.Errorf("event %d: %v; want refused %v", i, refused[i], want)
		}
	}
	checkHistory(t, db.DB, a, 1+1+1+1) // claimed, first, again, the superseded event
	checkHistory(t, db.DB, b, 1+1)
}

func create(t *testing.T, db *testdb.DB, state opstatus.State, lease *time.Time) opstatus.Operation {
	t.Helper()
	op := opstatus.Operation{ID: opstatus.NewID(), AccountID: "acct", Kind: "test.kind", State: state,
		IdempotencyKey: "k-" + opstatus.NewID(), Fingerprint: "fp", LeaseExpiresAt: lease}
	testdb.CreateOperation(t, db.DB, op)
	return op
}
