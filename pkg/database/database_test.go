package database_test

import (
	"net/url"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/faultproxy"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

func proxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	return faultproxy.Start(t, u.Host)
}

type pool struct{ DB *gorm.DB }

func open(t *testing.T, dsn string, o database.Options) pool {
	t.Helper()
	db, err := database.Open(dsn, o)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { sqlDB.Close() })
	return pool{DB: db}
}

// TestFrozenDatabaseIsBounded: with the server frozen (the proxy passes no byte either way) a statement on an
// open connection, and a new connection, each fail with a store failure instead of waiting for the thaw.
func TestFrozenDatabaseIsBounded(t *testing.T) {
	t.Parallel()
	p := proxy(t)
	pool := open(t, p.DSN(testdb.URL()), database.Options{MaxConns: 2, ConnectTimeout: 500 * time.Millisecond,
		AcquireTimeout: 500 * time.Millisecond, StatementTimeout: 500 * time.Millisecond})
	if err := pool.DB.Exec(`SELECT 1`).Error; err != nil {
		t.Fatal(err)
	}
	p.Stall(true)
	err := pool.DB.Exec(`SELECT ?::int`, 1).Error
	if !problem.IsStoreUnavailable(err) {
		t.Fatalf("statement on a frozen server: %v; want a store failure", err)
	}
	fresh := open(t, p.DSN(testdb.URL()), database.Options{MaxConns: 1, ConnectTimeout: 500 * time.Millisecond})
	if err := fresh.DB.Exec(`SELECT 1`).Error; !problem.IsStoreUnavailable(err) {
		t.Fatalf("connecting to a frozen server: %v; want a store failure", err)
	}
	p.Stall(false)
	if err := pool.DB.Exec(`SELECT ?::int`, 1).Error; err != nil {
		t.Fatalf("after the thaw: %v", err)
	}
}

// TestStatementTimeoutIsTheServers: a statement that runs longer than the bound is stopped by the server
// (57014), a store failure, and the connection stays usable.
func TestStatementTimeoutIsTheServers(t *testing.T) {
	t.Parallel()
	pool := open(t, testdb.URL(), database.Options{MaxConns: 1, StatementTimeout: 300 * time.Millisecond})
	err := pool.DB.Exec(`SELECT pg_sleep(?)`, 5).Error
	if !problem.IsStoreUnavailable(err) {
		t.Fatalf("long statement: %v; want a store failure", err)
	}
	if err := pool.DB.Exec(`SELECT ?::int`, 1).Error; err != nil {
		t.Fatalf("next statement: %v", err)
	}
}

// TestAcquireIsBounded: every connection of the pool is busy; a request for one gives up after the acquire
// bound with a store failure instead of queueing until one is free.
func TestAcquireIsBounded(t *testing.T) {
	t.Parallel()
	pool := open(t, testdb.URL(), database.Options{MaxConns: 1, AcquireTimeout: 300 * time.Millisecond})
	holder := pool.DB.Begin()
	if holder.Error != nil {
		t.Fatal(holder.Error)
	}
	defer holder.Rollback()
	var n int
	err := pool.DB.Raw(`SELECT ?::int`, 1).Scan(&n).Error
	if !problem.IsStoreUnavailable(err) {
		t.Fatalf("query with the pool exhausted: %v; want a store failure", err)
	}
	if err := pool.DB.Exec(`SELECT ?::int`, 1).Error; !problem.IsStoreUnavailable(err) {
		t.Fatalf("exec with the pool exhausted: %v; want a store failure", err)
	}
	if err := pool.DB.Transaction(func(tx *gorm.DB) error { return nil }); !problem.IsStoreUnavailable(err) {
		t.Fatalf("transaction with the pool exhausted: %v; want a store failure", err)
	}
	holder.Rollback()
	if err := pool.DB.Raw(`SELECT ?::int`, 1).Scan(&n).Error; err != nil || n != 1 {
		t.Fatalf("after the connection is free: %d, %v", n, err)
	}
}

// BenchmarkPool compares a round trip and a small transaction on the bounded pool with the same pool without
// bounds, to show what the acquire bound (a reserved connection per statement) costs.
func BenchmarkPool(b *testing.B) {
	for _, tc := range []struct {
		name string
		o    database.Options
	}{
		{"unbounded", database.Options{MaxConns: 4}},
		{"statement", database.Options{MaxConns: 4, StatementTimeout: 5 * time.Second}},
		{"acquire", database.Options{MaxConns: 4, AcquireTimeout: 3 * time.Second}},
		{"bounded", database.Options{MaxConns: 4, ConnectTimeout: 3 * time.Second, AcquireTimeout: 3 * time.Second, StatementTimeout: 5 * time.Second}},
	} {
		db, err := database.Open(testdb.URL(), tc.o)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name+"/select", func(b *testing.B) {
			var n int
			for b.Loop() {
				if err := db.Raw(`SELECT ?::int`, 1).Scan(&n).Error; err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/tx", func(b *testing.B) {
			for b.Loop() {
				err := db.Transaction(func(tx *gorm.DB) error {
					var n int
					return tx.Raw(`SELECT ?::int`, 1).Scan(&n).Error
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		sqlDB, _ := db.DB()
		sqlDB.Close()
	}
}
