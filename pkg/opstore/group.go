package opstore

import (
	"context"
	"sync"

	"github.com/retrysafe/retrysafe/pkg/database"

	"github.com/retrysafe/retrysafe/pkg/batch"
)

// GroupAppender appends events durably, and concurrent appends together (package batch): one INSERT and one
// commit for all the events that arrived while the previous group of their lane was being written. Retries of
// different requests (and a storm of retries of one) would otherwise each pay a commit of their own, which is
// most of what a replay costs. Grouped, they share a few.
//
// One group is written at a time (per lane, when Lanes spreads operations over several by their id), so the
// events of one operation this process appends keep their order.
//
// Its zero value is not usable; set DB.
type GroupAppender struct {
	DB database.DBTX
	// MaxGroup bounds one INSERT (256 when zero).
	MaxGroup int
	// Lanes is how many groups may be written at once (1 when zero).
	Lanes int

	once    sync.Once
	batcher *batch.Batcher[groupItem, error]
}

type groupItem = Appended

// Append adds an event to operation id of account, committed (with synchronous_commit on) when it returns nil.
// The operation must exist: the foreign key refuses the whole group otherwise. An attempt record whose attempt id
// the operation already has a record of is refused alone, with an error matching AttemptUsed.
func (g *GroupAppender) Append(ctx context.Context, accountID, id, eventType, actor string, detail any) error {
	it, err := newGroupItem(accountID, id, eventType, actor, detail)
	if err != nil {
		return err
	}
	g.once.Do(func() {
		g.batcher = &batch.Batcher[groupItem, error]{Run: g.insert, Max: g.MaxGroup, Lanes: g.Lanes}
	})
	refused, err := g.batcher.Do(ctx, id, it)
	if err != nil {
		return err
	}
	return refused
}

// newGroupItem marshals detail at once, so a detail that cannot be written fails its own Append, not its group.
func newGroupItem(accountID, id, eventType, actor string, detail any) (groupItem, error) {
	e, err := NewEvent{Type: eventType, Actor: actor, Detail: detail}.Marshalled(id)
	return groupItem{AccountID: accountID, ID: id, Event: e}, err
}

// insert writes group in one statement and returns, per item, nil. When an attempt record repeats an attempt id
// (operation_events_attempt), which refuses the whole statement, each item goes alone, so only the repeat is
// refused: its error is its result.
func (g *GroupAppender) insert(ctx context.Context, group []groupItem) ([]error, error) {
	err := g.insertRows(ctx, group)
	if len(group) == 1 || !AttemptUsed(err) {
		return make([]error, len(group)), err
	}
	refused := make([]error, len(group))
	for i := range group {
		if err := g.insertRows(ctx, group[i:i+1]); AttemptUsed(err) {
			refused[i] = err
		} else if err != nil {
			return nil, err
		}
	}
	return refused, nil
}

// insertRows writes group in one statement, in arrival order, so the events' ids follow it. Plain inserts: the
// audit record seals them later (package audit), and nothing here locks a row another writer waits for.
func (g *GroupAppender) insertRows(ctx context.Context, group []groupItem) error {
	return AppendAll(ctx, g.DB, group)
}
