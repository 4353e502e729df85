package opstatus

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// Owner marks the external operations a process claims with an id whose PostgreSQL advisory lock the process
// holds, session-level, on a connection of its own, for its lifetime. When the process dies its session ends and
// the lock goes with it, so another replica can tell a claim whose owner is gone (OwnerGone) from a call that is
// merely slow, without waiting for the lease.
//
// An owner that is alive but lost its lock connection (a database failover, a cut network) may see its claims
// released by others. That is safe because a released operation is cancelled under its row lock and its
// dispatch_started record can then no longer be written (StartDispatch), and a call whose record cannot be
// written is never sent: the owner's call is refused, never doubled. The owner takes a new id on a new
// connection for the claims it makes after.
type Owner struct {
	cfg  *pgx.ConnConfig
	log  *slog.Logger
	id   atomic.Int64
	stop context.CancelFunc
	done chan struct{}
}

// ownerLockClass is the first key of every owner's advisory lock (pg_advisory_lock(int4, int4)), its id the
// second: "rsow".
const ownerLockClass = 0x72736f77

// ownerCheckEvery is how often an owner checks that its lock connection is alive.
const ownerCheckEvery = time.Second

// HoldOwner starts holding an owner lock on the database at dsn, in the background until Close: the process may
// start while the database is down, and until the lock is held ID is 0 (claims are not marked, and wait for
// their lease as without an owner).
func HoldOwner(dsn string, logger *slog.Logger) (*Owner, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("opstatus: owner: %w", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	o := &Owner{cfg: cfg, log: logger, stop: stop, done: make(chan struct{})}
	go o.keep(ctx)
	return o, nil
}

// ID is the owner id whose lock this process holds now, or 0 while it holds none.
func (o *Owner) ID() int64 { return o.id.Load() }

// Close releases the lock (its session ends) and stops.
func (o *Owner) Close() {
	o.stop()
	<-o.done
}

// keep takes the lock, checks every ownerCheckEvery that its connection lives, and takes a new one when not.
func (o *Owner) keep(ctx context.Context) {
	defer close(o.done)
	var conn *pgx.Conn
	for {
		if conn != nil && ctx.Err() == nil && conn.Ping(ctx) != nil {
			o.id.Store(0)
			conn.Close(context.Background())
			conn = nil
			o.log.Warn("owner lock lost: claims made under it may be released by other replicas; their calls are refused")
		}
		if conn == nil && ctx.Err() == nil {
			conn = o.take(ctx)
		}
		select {
		case <-ctx.Done():
			o.id.Store(0)
			if conn != nil {
				conn.Close(context.Background())
			}
			return
		case <-time.After(ownerCheckEvery):
		}
	}
}

// take connects and locks a new random id, or returns nil (and logs) to try again later.
func (o *Owner) take(ctx context.Context) *pgx.Conn {
	conn, err := pgx.ConnectConfig(ctx, o.cfg)
	if err != nil {
		o.log.Warn("owner lock not taken yet", "error", err.Error())
		return nil
	}
	for range 8 {
		id := int64(rand.Int32N(math.MaxInt32-1)) + 1
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(ownerLockClass), int32(id)).Scan(&got); err != nil {
			break
		}
		if got {
			o.id.Store(id)
			o.log.Info("owner lock held", "owner", id)
			return conn
		}
	}
	conn.Close(context.Background())
	return nil
}

// OwnerGone reports whether operation id's claim is orphaned: the owner marked on its claimed event
// (ClaimOwner) holds no lock any more, and no call of it was started, so nothing of it can have left a process.
// Read it in a transaction that holds the operation's row lock before acting on it: StartDispatch waits for that
// lock, so the answer cannot change before the transaction ends.
func OwnerGone(ctx context.Context, db *gorm.DB, accountID, id string) (owner int64, gone bool, err error) {
	return opstore.OwnerGone(ctx, db, accountID, id, ownerLockClass)
}

// ClaimOwner is the key of a claimed event's detail that names the Owner of the process that claimed it.
const ClaimOwner = "owner"
