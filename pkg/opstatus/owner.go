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

	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// Owner marks the external operations a process claims with an id whose PostgreSQL advisory lock the process
// holds, session-level, on a connection of its own, for its lifetime. When the process dies its session ends and
// the lock goes with it, so another replica can tell a claim whose owner is gone (opstore.OwnerGone) from a call that is
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
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(opstore.OwnerLockClass), int32(id)).Scan(&got); err != nil {
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
