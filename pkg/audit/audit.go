// Package audit seals retrysafe's audit records in PostgreSQL, in the format of package auditchain, and verifies
// them.
//
// Records are the rows of operation_events (an operation's history), approval_events (an approval's
// decisions, written by a trigger on approvals) and grant_events (a grant's history: granted, used, revoked,
// written by a trigger on grants). A request inserts them as plain rows with its effect, in the
// same transaction: durable at once, never updated or deleted (triggers refuse it), and with nothing computed or
// locked for the audit record. Each row carries the id of the transaction that wrote it (xid, a xid8).
//
// # Sealing
//
// A Sequencer seals the records written since the last seal, every interval (AUDIT_SEAL_INTERVAL, 1 s by
// default), in batches of at most MaxSealRecords: one row of audit_seals per batch (auditchain.Seal). A seal
// holds its batch's entries in sealed order, each naming one record (table, id, account, subject: the operation
// or approval) with the hash of its content (auditchain.RecordHash of operationRecord or approvalRecord: the
// row's fields but its id, which the entry names, so records that trade contents show); the hash of the
// entries; the batch's first ordinal and count in the order of all sealed records; where the batch ends in each
// table (Through); the previous seal's hash; and an Ed25519 signature when a Signer is set. A record is tied to
// its seal by the entry that names it, so no record is touched after its insert, and a seal is one insert.
//
// The order records are sealed in is each table's (xid, id), operation_events' first in a batch, and a batch
// takes only records whose xid is below the xmin of the sequencer's snapshot (the sealable read): see there why no
// record is ever skipped. An operation's history is shown in id order (operation_events_numbered), which the
// entries bind too. Batches are
// written by one sequencer at a time per schema (a session advisory lock; any replica may run one, and the
// others wait their turn), each in one transaction, so a sequencer that dies mid-batch leaves nothing sealed.
//
// # What it promises
//
// A record is durable when its request commits and tamper-evident once it is sealed, normally within an
// interval. Until then a writer with database access can change or remove it without a trace; after, changing,
// removing or reordering it breaks its seal, and rewriting seals to match breaks their chain, or their
// signatures for whoever lacks the signing key. Verify reports how many records are still unsealed and how old
// the oldest is: the window is measured, not assumed.
//
//   - Verify reads everything back in one snapshot, read-only, and reports the first bad record of each subject.
//   - Export writes a bundle of records with the seals and key that check them; VerifyBundle checks it with no
//     database, by the same checks as Verify.
//
// Every process that serves runs a sequencer; an auditor verifies:
//
//	s := &audit.Sequencer{DB: db, Signer: signer, Logger: logger}
//	go s.Run(ctx)
//	report, err := audit.Verify(ctx, db, audit.VerifyOptions{PublicKey: pub})
package audit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
)

// DefaultSealInterval is how often a Sequencer seals when its Interval is zero.
const DefaultSealInterval = time.Second

// MaxSealRecords is the most records one seal holds: a seal's entries are read, hashed and stored at once, and
// read whole again by every check of one of its records. A larger backlog is sealed by several seals in a row.
const MaxSealRecords = 10000

// sealLock is the first key of the session advisory lock that makes sequencers take turns; the second is the
// schema's, since the seals are the schema's.
const sealLock = 0x72736561 // "rsea"

// FailpointBeforeSealCommit is hit after a seal is inserted and before its transaction commits, given the seal
// (package failpoint): a test stops or kills the sequencer there.
const FailpointBeforeSealCommit = "audit.before_seal_commit"

// Sequencer seals new records in batches (package doc, "Sealing"). Its zero value is not usable; set DB.
type Sequencer struct {
	DB database.Pool
	// Signer signs each seal; nil leaves them unsigned.
	Signer *auditchain.Signer
	// Interval is how often it seals (DefaultSealInterval when zero).
	Interval time.Duration
	// Logger is told of failed runs; nil discards.
	Logger *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Run seals until ctx ends.
func (s *Sequencer) Run(ctx context.Context) {
	interval := s.Interval
	if interval <= 0 {
		interval = DefaultSealInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A full seal means more records may be waiting: seal them now, not one batch per tick.
		for ctx.Err() == nil {
			seal, err := s.RunOnce(ctx)
			if err != nil && ctx.Err() == nil && s.Logger != nil {
				s.Logger.WarnContext(ctx, "audit seal failed", "error", err.Error())
			}
			if err != nil || seal == nil || seal.Count < MaxSealRecords {
				break
			}
		}
	}
}

// The sealable read (a source's sealable: opstore.RecordsAfter, sealableApprovalsSQL) takes the next records of
// one table to seal: those after the table's last sealed position in (xid, id) order whose transaction ended
// before the statement's snapshot was taken,
//
//	WHERE (xid, id) > (last sealed) AND xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY xid, id LIMIT n
//
// Why no record is ever skipped: pg_snapshot_xmin is the oldest transaction id still running when the snapshot
// was taken, so every transaction with a lower id has ended, committed or not, and its records are visible now or
// never will be; a transaction that gets its id later gets a higher one. So once the records up to a position p
// with xid < xmin are sealed, no record at or before p can appear afterwards: each batch is a prefix of the
// table's records in (xid, id) order, and the next one starts right after it. A record whose transaction
// commits late (or runs long) holds back only the records at or after its own xid, until it ends.

// RunOnce seals the records written since the last seal, at most MaxSealRecords, and returns the seal (nil when
// there was nothing to seal). It waits for a sequencer of another replica to finish first.
func (s *Sequencer) RunOnce(ctx context.Context) (*auditchain.Seal, error) {
	var written *auditchain.Seal
	err := s.onConn(ctx, func(conn *sql.Conn) error {
		release, err := takeSealLock(ctx, conn)
		if err != nil {
			return err
		}
		defer release()
		return database.InTx(ctx, conn, nil, func(tx *sql.Tx) error {
			written, err = s.sealNext(ctx, tx)
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("audit: seal: %w", err)
	}
	return written, nil
}

// onConn runs fn on a connection of the pool, given back when fn returns.
func (s *Sequencer) onConn(ctx context.Context, fn func(conn *sql.Conn) error) error {
	conn, err := s.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return fn(conn)
}

// takeSealLock waits for the session advisory lock that makes sequencers take turns, on conn, and returns
// its release.
func takeSealLock(ctx context.Context, conn *sql.Conn) (release func(), err error) {
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1, hashtext(current_schema()))`, sealLock); err != nil {
		return nil, err
	}
	return func() {
		// Not with ctx, which may be over; a connection that cannot say it ends its session, and the lock.
		unlock, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(unlock, `SELECT pg_advisory_unlock($1, hashtext(current_schema()))`, sealLock)
	}, nil
}

// sealNext seals, in tx, the records after the newest seal's positions and returns the seal (nil when there
// was nothing to seal).
func (s *Sequencer) sealNext(ctx context.Context, tx database.DBTX) (*auditchain.Seal, error) {
	prev, err := newestSeal(ctx, tx)
	if err != nil {
		return nil, err
	}
	through := map[string]auditchain.Position{}
	if prev != nil {
		maps.Copy(through, prev.Through)
	}
	entries, err := nextEntries(ctx, tx, through)
	if err != nil || len(entries) == 0 {
		return nil, err
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	seal, err := auditchain.NextSeal(prev, now(), entries, through, s.Signer)
	if err != nil {
		return nil, err
	}
	if err := insertSeal(ctx, tx, seal, entries); err != nil {
		return nil, err
	}
	failpoint.Hit(FailpointBeforeSealCommit, seal)
	return &seal, nil
}

// nextEntries reads the records to seal, table by table, after each table's position in through, at most
// MaxSealRecords in all, and moves through to the last record read of each table.
func nextEntries(ctx context.Context, tx database.DBTX, through map[string]auditchain.Position) ([]auditchain.Entry, error) {
	var entries []auditchain.Entry
	for _, src := range sources {
		from := sealedThrough(through, src.table)
		rows, err := src.sealable(ctx, tx, from, MaxSealRecords-len(entries))
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			h, err := auditchain.RecordHash(src.body(r))
			if err != nil {
				return nil, fmt.Errorf("%s id %d: %w", src.table, r.ID, err)
			}
			entries = append(entries, auditchain.Entry{Table: src.table, ID: r.ID, AccountID: r.AccountID, Subject: r.Subject, Hash: h})
		}
		if len(rows) > 0 {
			through[src.table] = auditchain.Position{XID: rows[len(rows)-1].XID, ID: rows[len(rows)-1].ID}
		}
	}
	return entries, nil
}

// sealedThrough is how far the seals' positions through reach into table: before its first record when no
// seal reaches into it yet.
func sealedThrough(through map[string]auditchain.Position, table string) auditchain.Position {
	if pos, ok := through[table]; ok {
		return pos
	}
	return auditchain.Position{XID: "0", ID: math.MinInt64}
}

// Pending returns how many records are not sealed yet and the creation time of the oldest of them (zero when
// none is): the records after the newest seal's position in each table, read by the index on (xid, id).
func Pending(ctx context.Context, db database.Pool) (int64, time.Time, error) {
	var n int64
	var oldest time.Time
	err := database.InTx(ctx, db, nil, func(tx *sql.Tx) error {
		through, err := newestThrough(ctx, tx)
		if err != nil {
			return err
		}
		for _, src := range sources {
			from := sealedThrough(through, src.table)
			count, first, err := src.pending(ctx, tx, from)
			if err != nil {
				return err
			}
			n += count
			if first != nil && (oldest.IsZero() || first.Before(oldest)) {
				oldest = *first
			}
		}
		return nil
	})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("audit: pending: %w", err)
	}
	return n, oldest, nil
}

// newestThrough is where the newest seal ends in each table (empty when there is no seal).
func newestThrough(ctx context.Context, tx database.DBTX) (map[string]auditchain.Position, error) {
	last, err := newestSeal(ctx, tx)
	if err != nil {
		return nil, err
	}
	if last == nil {
		return map[string]auditchain.Position{}, nil
	}
	return last.Through, nil
}

// newestSeal is the last seal written, nil when there is none.
func newestSeal(ctx context.Context, tx database.DBTX) (*auditchain.Seal, error) {
	var last sealRow
	err := tx.QueryRowContext(ctx, `SELECT `+sealHeaderColumns+` FROM audit_seals ORDER BY seq DESC LIMIT 1`).Scan(last.dest()...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s, err := last.seal()
	if err != nil {
		return nil, err
	}
	return &s, nil
}
