package opstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sync"

	"gorm.io/gorm"
)

// GroupAppender appends events durably, and concurrent appends together: one INSERT and one commit for all the
// events that arrived while the previous group of their lane was being written. Events of one operation are
// chained one after another (each waits for the operation's chain head), so a storm of retries of one request
// would otherwise wait for one disk flush each; and retries of different requests would each pay a commit of
// their own, which is most of what a replay costs. Grouped, they share a few.
//
// Operations are spread over a few lanes by their id; one group is written at a time per lane, so the events of
// one operation keep their order, and two groups in flight never hold the same chain head.
//
// Its zero value is not usable; set DB.
type GroupAppender struct {
	DB *gorm.DB
	// MaxGroup bounds one INSERT (256 when zero).
	MaxGroup int
	// Lanes is how many groups may be written at once (4 when zero).
	Lanes int

	mu     sync.Mutex
	queues map[int]*groupQueue
}

type groupQueue struct {
	pending []*groupItem
}

type groupItem struct {
	accountID, id, eventType, actor string
	detail                          []byte
	done                            chan error
	// lead is closed, instead of done being sent to, when this item's caller must write the next group.
	lead chan struct{}
}

// lane is the lane of operation id.
func (g *GroupAppender) lane(id string) int {
	n := g.Lanes
	if n <= 0 {
		n = 4
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// Append adds an event to operation id of account, committed (with synchronous_commit on) when it returns nil.
// The operation must exist: the foreign key refuses the whole group otherwise.
func (g *GroupAppender) Append(ctx context.Context, accountID, id, eventType, actor string, detail any) error {
	raw := []byte("{}")
	if detail != nil {
		var err error
		if raw, err = json.Marshal(detail); err != nil {
			return fmt.Errorf("opstatus: append to %s: detail: %w", id, err)
		}
	}
	it := &groupItem{accountID: accountID, id: id, eventType: eventType, actor: actor, detail: raw, done: make(chan error, 1), lead: make(chan struct{})}
	lane := g.lane(id)
	g.mu.Lock()
	if g.queues == nil {
		g.queues = map[int]*groupQueue{}
	}
	q, busy := g.queues[lane]
	if !busy {
		q = &groupQueue{}
		g.queues[lane] = q
	}
	q.pending = append(q.pending, it)
	g.mu.Unlock()
	if busy {
		// Another caller is writing a group of this lane: ours goes in the next one, which we may have to write
		// ourselves.
		select {
		case err := <-it.done:
			return err
		case <-it.lead:
		}
	}
	g.writeGroups(ctx, lane, q)
	return <-it.done
}

// writeGroups writes the pending group of q, then hands the queue to the first caller of the next group (or
// removes it when nobody is waiting), so no caller writes more than one group.
func (g *GroupAppender) writeGroups(ctx context.Context, lane int, q *groupQueue) {
	limit := g.MaxGroup
	if limit <= 0 {
		limit = 256
	}
	g.mu.Lock()
	n := min(len(q.pending), limit)
	group := q.pending[:n:n]
	q.pending = q.pending[n:]
	g.mu.Unlock()

	err := g.insert(ctx, group)
	for _, it := range group {
		it.done <- err
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	if len(q.pending) == 0 {
		delete(g.queues, lane)
		return
	}
	close(q.pending[0].lead)
}

func (g *GroupAppender) insert(ctx context.Context, group []*groupItem) error {
	accounts, ids, types, actors, details := make([]string, len(group)), make([]string, len(group)), make([]string, len(group)),
		make([]string, len(group)), make([]string, len(group))
	for i, it := range group {
		accounts[i], ids[i], types[i], actors[i], details[i] = it.accountID, it.id, it.eventType, it.actor, string(it.detail)
	}
	// The caller that writes may have hung up; the others still wait for their events. Rows go in by operation
	// id, then arrival: each row takes its chain's head, and groups written at once by other processes (replicas
	// of this service) may hold heads of the same operations: taken in one global order, they never wait on each
	// other in a cycle. One statement text whatever the group's size (arrays, not a VALUES list per size), so
	// the driver prepares it once and the server plans it once; through database/sql, not gorm, which renders
	// every statement with its arguments for its logger. No join with operations: the foreign key checks that
	// each operation exists, one primary-key probe per row, where a join's plan, cached while the table was
	// empty, was a hash join over every operation, on every group from then on.
	_, err := g.DB.Statement.ConnPool.ExecContext(context.WithoutCancel(ctx), `
INSERT INTO operation_events (operation_id, account_id, type, actor, detail)
SELECT v.id, v.account_id, v.type, v.actor, v.detail::jsonb
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS v(account_id, id, type, actor, detail, ord)
ORDER BY v.id COLLATE "C", v.ord`, accounts, ids, types, actors, details)
	if err != nil {
		if len(group) == 1 {
			return fmt.Errorf("opstatus: append to %s: %w", group[0].id, err)
		}
		return fmt.Errorf("opstatus: append %d events to %s and others: %w", len(group), group[0].id, err)
	}
	return nil
}
