package opstatus

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/batch"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// GroupAppender appends events durably, and concurrent appends together (package batch): one transaction, of two
// round trips, for all the events that arrived while the previous group of their lane was being written. Events
// of one operation are chained one after another (each waits for the operation's chain head), so a storm of
// retries of one request would otherwise wait for one disk flush each; and retries of different requests would
// each pay a commit of their own, which is most of what a replay costs. Grouped, they share a few.
//
// The group's records are linked here (audit.ContinueOperationChain), not by the database's trigger, which would
// canonicalize and hash each record in PL/pgSQL and update its chain's head once per record: the heads of the
// group's chains are locked first, and each is moved once, with the records, at commit.
//
// Operations are spread over a few lanes by their id; one group is written at a time per lane, so the events of
// one operation keep their order, and two groups in flight never hold the same chain head.
//
// Its zero value is not usable; set DB.
type GroupAppender struct {
	// DB is the pool (not a transaction): each group is a transaction of its own (database.BeginPipelined).
	DB *gorm.DB
	// MaxGroup bounds one group (256 when zero).
	MaxGroup int
	// Lanes is how many groups may be written at once (4 when zero).
	Lanes int

	once    sync.Once
	batcher *batch.Batcher[groupItem, struct{}]
}

type groupItem struct {
	accountID, id, eventType, actor string
	detail                          []byte
	attempt                         bool
}

// Append adds an event to operation id of account, committed (with synchronous_commit on) when it returns nil.
// The operation must exist: the foreign key refuses the whole group otherwise.
func (g *GroupAppender) Append(ctx context.Context, accountID, id, eventType, actor string, detail any) error {
	it, err := newGroupItem(accountID, id, eventType, actor, detail)
	if err != nil {
		return err
	}
	g.once.Do(func() {
		g.batcher = &batch.Batcher[groupItem, struct{}]{Run: g.insert, Max: g.MaxGroup, Lanes: g.Lanes}
	})
	_, err = g.batcher.Do(ctx, id, it)
	return err
}

func newGroupItem(accountID, id, eventType, actor string, detail any) (groupItem, error) {
	raw := []byte("{}")
	if detail != nil {
		var err error
		if raw, err = json.Marshal(detail); err != nil {
			return groupItem{}, fmt.Errorf("opstatus: append to %s: detail: %w", id, err)
		}
	}
	return groupItem{accountID: accountID, id: id, eventType: eventType, actor: actor, detail: raw,
		attempt: audit.IsAttemptJSON(raw)}, nil
}

func (g *GroupAppender) insert(ctx context.Context, group []groupItem) ([]struct{}, error) {
	if err := g.write(ctx, group); err != nil {
		if len(group) == 1 {
			return nil, fmt.Errorf("opstatus: append to %s: %w", group[0].id, err)
		}
		return nil, fmt.Errorf("opstatus: append %d events to %s and others: %w", len(group), group[0].id, err)
	}
	return make([]struct{}, len(group)), nil
}

// chainKey names an operation's chain: its row of audit_chain_heads.
type chainKey struct{ accountID, id string }

// lockHeadsSQL locks the heads of a group's chains ($1 accounts, $2 operation ids) and returns them. They are
// locked one at a time in one global order, by chain COLLATE "C", as the trigger takes them when a statement
// inserts records in that order (what replicas that chain through the trigger write): two groups written at once
// by different processes never wait on each other in a cycle.
//
// Each head is reached by its primary key, in a LATERAL subquery that cannot be turned into a join: joined, the
// generic plan a connection keeps, made while the table was nearly empty, is a hash join over every head. The
// keys are walked by subscript, not unnest: PostgreSQL estimates an unnest from the array at hand, so a group of
// one chain always looked cheaper to plan again than the generic plan for ten, and was (0.1 to 0.2 ms a group);
// generate_subscripts has one estimate, and the generic plan is kept (GroupAppender's plan test).
const lockHeadsSQL = `
SELECT h.account_id, h.chain, h.seq, h.hash, h.attempts
FROM (SELECT ($1::text[])[i] AS account_id, ($2::text[])[i] AS chain FROM generate_subscripts($2::text[], 1) AS i
      ORDER BY ($2::text[])[i] COLLATE "C") AS k,
    LATERAL (SELECT h.account_id, h.chain, h.seq, h.hash, h.attempts FROM audit_chain_heads h
             WHERE h.account_id = k.account_id AND h.chain = k.chain FOR UPDATE) AS h`

// appendLinkedSQL inserts a group's records ($1-$9, one array per column, $10 their created_at) and moves the
// heads of their chains ($11-$16, one per chain). One statement text whatever the group's size (arrays, not a
// VALUES list per size), so the driver prepares it once and the server plans it once.
//
// Rows are inserted in the arrays' order, chain by chain, each chain's in its order: the id column's default is taken
// row by row, after this transaction locked the chains' heads, so ids follow each chain's order, as verify
// checks. A row without a hash belongs to a chain with no head row, and the trigger links it.
//
// No join with operations: the foreign key checks that each operation exists, one primary-key probe per row,
// and its failure fails the statement, so COMMIT, sent with it unread, does not run. The heads are moved with
// INSERT ... ON CONFLICT DO UPDATE, which reaches each by its primary key, where an UPDATE ... FROM the arrays
// would be planned as a join. Each of them exists and is locked by this transaction since lockHeadsSQL, so each
// conflicts and none can have moved: the insert path is never taken.
const appendLinkedSQL = `
WITH moved AS (
    INSERT INTO audit_chain_heads AS h (account_id, chain, seq, hash, prev_hash, attempts)
    SELECT * FROM unnest($11::text[], $12::text[], $13::bigint[], $14::text[], $15::text[], $16::bigint[])
    ON CONFLICT (account_id, chain) DO UPDATE
    SET seq = excluded.seq, hash = excluded.hash, prev_hash = excluded.prev_hash, attempts = excluded.attempts,
        checkpointed = false
)
INSERT INTO operation_events (account_id, operation_id, type, actor, detail, created_at, attempt, chain_seq, prev_hash, hash)
SELECT v.account_id, v.id, v.type, v.actor, v.detail::jsonb, $10::timestamptz, v.attempt, v.seq, v.prev_hash, v.hash
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::text[], $9::text[])
    WITH ORDINALITY AS v(account_id, id, type, actor, detail, attempt, seq, prev_hash, hash, ord)
ORDER BY v.ord`

// write writes group in one pipelined transaction: BEGIN with the lock of its chains' heads, then its records,
// linked in Go from those heads, with COMMIT.
func (g *GroupAppender) write(ctx context.Context, group []groupItem) error {
	// By chain, then arrival: the records of a chain are linked, and get their ids, in the order they came.
	items := slices.Clone(group)
	slices.SortStableFunc(items, func(a, b groupItem) int {
		return cmp.Or(strings.Compare(a.id, b.id), strings.Compare(a.accountID, b.accountID))
	})
	var accounts, ids []string
	for i, it := range items {
		if i == 0 || it.id != items[i-1].id || it.accountID != items[i-1].accountID {
			accounts, ids = append(accounts, it.accountID), append(ids, it.id)
		}
	}

	t, err := database.BeginPipelined(ctx, g.DB)
	if err != nil {
		return err
	}
	defer t.Close()
	heads := make(map[chainKey]audit.Head, len(ids))
	err = t.Begin(ctx, func(rows pgx.Rows) error {
		for rows.Next() {
			var k chainKey
			var h audit.Head
			if err := rows.Scan(&k.accountID, &k.id, &h.Seq, &h.Hash, &h.Attempts); err != nil {
				return err
			}
			heads[k] = h
		}
		return rows.Err()
	}, lockHeadsSQL, accounts, ids)
	if err != nil {
		return err
	}
	rows, err := link(items, heads, time.Now())
	if err != nil {
		return err
	}
	return t.Commit(ctx, appendLinkedSQL, rows.accounts, rows.ids, rows.types, rows.actors, rows.details,
		rows.attempts, rows.seqs, rows.prevHashes, rows.hashes, rows.createdAt,
		rows.headAccounts, rows.headChains, rows.headSeqs, rows.headHashes, rows.headPrevHashes, rows.headAttempts)
}

// linkedRows are a group's records as appendLinkedSQL takes them, one array per column, and the chains' heads
// after them.
type linkedRows struct {
	accounts, ids, types, actors, details []string
	// attempts, seqs, prevHashes and hashes are nil for the records the trigger links.
	attempts, seqs     []*int64
	prevHashes, hashes []*string
	createdAt          time.Time

	headAccounts, headChains   []string
	headSeqs, headAttempts     []int64
	headHashes, headPrevHashes []string
}

// link links items (sorted by chain, then arrival) from heads, the chains' heads as locked; a chain without a
// head (every operation gets one with its first record, so it should not happen) is left to the trigger.
func link(items []groupItem, heads map[chainKey]audit.Head, now time.Time) (linkedRows, error) {
	n := len(items)
	r := linkedRows{
		accounts: make([]string, n), ids: make([]string, n), types: make([]string, n), actors: make([]string, n),
		details: make([]string, n), attempts: make([]*int64, n), seqs: make([]*int64, n),
		prevHashes: make([]*string, n), hashes: make([]*string, n),
		// What the record holds is what is hashed: PostgreSQL keeps microseconds.
		createdAt: now.UTC().Truncate(time.Microsecond),
	}
	for i, it := range items {
		r.accounts[i], r.ids[i], r.types[i], r.actors[i], r.details[i] = it.accountID, it.id, it.eventType, it.actor, string(it.detail)
	}
	for start := 0; start < n; {
		end := start + 1
		for end < n && items[end].id == items[start].id && items[end].accountID == items[start].accountID {
			end++
		}
		key := chainKey{items[start].accountID, items[start].id}
		head, ok := heads[key]
		if !ok {
			start = end
			continue
		}
		events := make([]audit.OperationEvent, end-start)
		attempts := make([]bool, end-start)
		for j, it := range items[start:end] {
			events[j] = audit.OperationEvent{OperationID: it.id, AccountID: it.accountID, Type: it.eventType,
				Actor: it.actor, Detail: it.detail, CreatedAt: r.createdAt}
			attempts[j] = it.attempt
		}
		links, count, err := audit.ContinueOperationChain(head, events, attempts)
		if err != nil {
			return linkedRows{}, err
		}
		for j, l := range links {
			seq, prev, hash := l.Seq, l.PrevHash, l.Hash
			r.attempts[start+j], r.seqs[start+j], r.prevHashes[start+j], r.hashes[start+j] = l.Attempt, &seq, &prev, &hash
		}
		last := links[len(links)-1]
		r.headAccounts, r.headChains = append(r.headAccounts, key.accountID), append(r.headChains, key.id)
		r.headSeqs, r.headHashes = append(r.headSeqs, last.Seq), append(r.headHashes, last.Hash)
		r.headPrevHashes, r.headAttempts = append(r.headPrevHashes, last.PrevHash), append(r.headAttempts, count)
		start = end
	}
	return r, nil
}
