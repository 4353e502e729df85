// Package audit keeps retrysafe's server-side audit chain in PostgreSQL, in the format of package auditchain.
//
// The links are written by triggers (migrations/00006_audit_chain.sql) in the same statement that inserts an
// operation event or an approval decision, so every write path is chained without a round trip of its own: one
// chain per operation, one per approval, each serialized on its own head row. A writer may link an operation's
// records itself instead (ContinueOperationChain), in the same format, under the same head row. This package
// adds the rest:
//
//   - CheckpointWorker seals the heads of the chains that moved, every interval, optionally signed; any number
//     of replicas may run it and one chain of checkpoints results.
//
//   - Export writes a bundle of records with the checkpoints and key that check them; VerifyBundle checks it with
//     no database, by the same checks as Verify.
//
//   - Verify reads everything back in one snapshot, read-only, and reports the first bad record of each chain.
//
//     w := &audit.CheckpointWorker{DB: db, Signer: signer, Interval: 10 * time.Second, Logger: logger}
//     go w.Run(ctx)
//     report, err := audit.Verify(ctx, db, audit.VerifyOptions{PublicKey: pub})
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// checkpointLock is the advisory lock that makes checkpoint writers of all replicas take turns.
const checkpointLock = 0x72735f6175646974 // "rs_audit"

// MaxCheckpointHeads is the most heads one checkpoint seals. Its heads are held, rendered and canonicalized in
// memory at once (50,000 took the service to 150 MB after a large backlog); a backlog larger than this is sealed
// by several checkpoints in a row (Run).
const MaxCheckpointHeads = 10000

// CheckpointWorker writes a checkpoint over the heads of every chain that moved since the last one.
type CheckpointWorker struct {
	DB *gorm.DB
	// Signer signs each checkpoint; nil leaves them unsigned.
	Signer   *auditchain.Signer
	Interval time.Duration
	// Logger is told of failed checkpoints; nil discards.
	Logger *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Run writes checkpoints until ctx ends.
func (w *CheckpointWorker) Run(ctx context.Context) {
	interval := w.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A full checkpoint means more chains may be waiting: seal them now, not one batch per tick.
		for ctx.Err() == nil {
			cp, err := w.RunOnce(ctx)
			if err != nil && ctx.Err() == nil && w.Logger != nil {
				w.Logger.WarnContext(ctx, "audit checkpoint failed", "error", err.Error())
			}
			if err != nil || cp == nil || len(cp.Heads) < MaxCheckpointHeads {
				break
			}
		}
	}
}

// RunOnce writes one checkpoint if some chain moved, and returns it (nil when nothing moved). It seals at most
// MaxCheckpointHeads heads.
func (w *CheckpointWorker) RunOnce(ctx context.Context) (*auditchain.Checkpoint, error) {
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	var written *auditchain.Checkpoint
	// One connection for the whole of it, holding the session's advisory lock: the checkpoint commits first and
	// its heads are sealed after, in short transactions of their own, and another replica's checkpoint must not
	// start in between (it would cover the same heads again).
	err := w.DB.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		if err := conn.Exec(`SELECT pg_advisory_lock(?)`, int64(checkpointLock)).Error; err != nil {
			return err
		}
		defer func() {
			// Not with ctx, which may be over; a connection that cannot say it ends its session, and the lock.
			unlock, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			conn.WithContext(unlock).Exec(`SELECT pg_advisory_unlock(?)`, int64(checkpointLock))
		}()
		var moved []movedHead
		err := conn.Transaction(func(tx *gorm.DB) error {
			var prev []struct {
				Seq  int64
				Hash string
			}
			if err := tx.Raw(`SELECT seq, hash FROM audit_checkpoints ORDER BY seq DESC LIMIT 1`).Scan(&prev).Error; err != nil {
				return err
			}
			// The moved heads are read without a lock, as committed: every write to one of these chains (a
			// retry's attempt record moves its head) would otherwise wait for the whole checkpoint (300 ms and
			// more for 10,000 heads under load: the slowest replays of a run). They are sealed once it commits.
			err := tx.Raw(`SELECT account_id, chain, seq, hash FROM audit_chain_heads WHERE NOT checkpointed ORDER BY chain LIMIT ?`,
				MaxCheckpointHeads).Scan(&moved).Error
			if err != nil || len(moved) == 0 {
				return err
			}
			heads := make([]auditchain.Head, len(moved))
			for i, m := range moved {
				heads[i] = auditchain.Head{Chain: m.Chain, Seq: m.Seq, Hash: m.Hash}
			}
			var last *auditchain.Checkpoint // NextCheckpoint links to its seq and hash alone
			if len(prev) == 1 {
				last = &auditchain.Checkpoint{Seq: prev[0].Seq, Hash: prev[0].Hash}
			}
			cp, err := auditchain.NextCheckpoint(last, now(), heads, w.Signer)
			if err != nil {
				return err
			}
			rawHeads, err := json.Marshal(cp.Heads)
			if err != nil {
				return err
			}
			var sig *string
			if cp.Signature != "" {
				sig = &cp.Signature
			}
			err = tx.Exec(`INSERT INTO audit_checkpoints (seq, prev_hash, created_at, heads, hash, signature) VALUES (?, ?, ?, ?::jsonb, ?, ?)`,
				cp.Seq, cp.Prev, cp.At, string(rawHeads), cp.Hash, sig).Error
			if err != nil {
				return err
			}
			written = &cp
			return nil
		})
		if err != nil || written == nil {
			return err
		}
		return seal(ctx, conn, moved)
	})
	if err != nil {
		return nil, fmt.Errorf("audit: checkpoint: %w", err)
	}
	return written, nil
}

// movedHead is a chain head that moved since the last checkpoint, as RunOnce read it.
type movedHead struct {
	AccountID string
	Chain     string
	Seq       int64
	Hash      string
}

// sealBatch is how many heads one sealing statement marks: each holds its heads' rows until it commits, and a
// writer of one of those chains waits for it (about 25 ms for 500 heads under load, where one statement for
// 10,000 took 350 ms).
const sealBatch = 500

// seal marks the heads a committed checkpoint covers as checkpointed, sealBatch at a time, each batch its own
// statement and commit, where each head still is what the checkpoint holds. A head that moved after it was read,
// or that a writer holds right now (skipped, not waited for), stays unsealed: its writer's commit leaves it
// moved, and the next checkpoint covers its new state; this one is still true of the chain as it was. So is a
// head left unsealed by a failure here: it is covered again next time.
func seal(ctx context.Context, db *gorm.DB, moved []movedHead) error {
	for start := 0; start < len(moved); start += sealBatch {
		if err := sealHeads(ctx, db, moved[start:min(start+sealBatch, len(moved))]); err != nil {
			return err
		}
	}
	return nil
}

func sealHeads(ctx context.Context, db *gorm.DB, moved []movedHead) error {
	accounts, chains, seqs := make([]string, len(moved)), make([]string, len(moved)), make([]int64, len(moved))
	for i, m := range moved {
		accounts[i], chains[i], seqs[i] = m.AccountID, m.Chain, m.Seq
	}
	// database/sql directly: gorm would spread the slices into lists of placeholders.
	_, err := db.Statement.ConnPool.ExecContext(ctx, `
WITH still AS (
    SELECT h.account_id, h.chain FROM audit_chain_heads h
    JOIN unnest($1::text[], $2::text[], $3::bigint[]) AS m(account_id, chain, seq)
      ON h.account_id = m.account_id AND h.chain = m.chain AND h.seq = m.seq
    WHERE NOT h.checkpointed
    FOR UPDATE OF h SKIP LOCKED
)
UPDATE audit_chain_heads h SET checkpointed = true FROM still WHERE h.account_id = still.account_id AND h.chain = still.chain`,
		accounts, chains, seqs)
	return err
}

const checkpointColumns = `seq, prev_hash, created_at, heads::text AS heads, hash, signature`

type checkpointRow struct {
	Seq       int64
	PrevHash  string
	CreatedAt time.Time
	Heads     string
	Hash      string
	Signature *string
}

func (r checkpointRow) checkpoint() (auditchain.Checkpoint, error) {
	cp := auditchain.Checkpoint{Seq: r.Seq, Prev: r.PrevHash, At: r.CreatedAt, Hash: r.Hash}
	if r.Signature != nil {
		cp.Signature = *r.Signature
	}
	if err := json.Unmarshal([]byte(r.Heads), &cp.Heads); err != nil {
		return auditchain.Checkpoint{}, fmt.Errorf("audit: checkpoint %d: heads: %w", r.Seq, err)
	}
	return cp, nil
}
