package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// order is a row written with tx.Create, as an adopter writes: on a pool opened with gorm's default config, gorm
// wraps each Create in a transaction of its own unless it sees one already open.
type order struct {
	ID   string
	Item string
}

// ordersEnv serves POST /orders on a pool opened with gorm's default config; fail makes the write return an
// error after its insert.
func ordersEnv(t *testing.T, fail func() bool) *servicetest.Env {
	t.Helper()
	env := servicetest.New(t, servicetest.GormDefaults())
	if err := env.DB.Exec(`CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, item text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	create := func(c *gin.Context) {
		idemgin.Do(env.Idem, c, idem.Request{Kind: "orders.create", Command: map[string]any{"item": "book"}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				o := order{ID: "ord_" + op.ID, Item: "book"}
				if err := tx.Create(&o).Error; err != nil {
					return idem.Result{}, err
				}
				if fail() {
					return idem.Result{}, errors.New("the write failed after its insert")
				}
				return idem.Result{Status: http.StatusCreated, Body: o}, nil
			})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/orders", create) }))
	return env
}

func count(t *testing.T, env *servicetest.Env, query string) int64 {
	t.Helper()
	var n int64
	if err := env.DB.Raw(query).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGormDefaultConfigCopiesMakeOneOrder: 50 concurrent copies of one request, written with tx.Create on a pool
// with gorm's default transaction: one order, one key, one operation, and every copy gets its answer.
func TestGormDefaultConfigCopiesMakeOneOrder(t *testing.T) {
	t.Parallel()
	env := ordersEnv(t, func() bool { return false })
	answers := make([]answer, 50)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = post(env.URL+"/orders", "order-1", `{}`) })
	}
	wg.Wait()
	var first string
	for _, a := range answers {
		if a.err != nil || a.status != http.StatusCreated {
			t.Fatalf("a copy got %d %s (%v); want 201", a.status, a.body, a.err)
		}
		if first == "" {
			first = a.body
		}
		if a.body != first {
			t.Fatalf("copies got different answers: %s and %s", first, a.body)
		}
	}
	if n := count(t, env, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders for 50 copies of one request; want 1", n)
	}
	if n := count(t, env, `SELECT count(*) FROM operations WHERE idempotency_key = 'order-1'`); n != 1 {
		t.Fatalf("%d operations; want 1", n)
	}
}

// TestGormDefaultConfigFailedWriteKeepsNothing: a write that fails after its insert leaves no order and the key
// free; a retry with the key then makes exactly one order.
func TestGormDefaultConfigFailedWriteKeepsNothing(t *testing.T) {
	t.Parallel()
	var failing sync.Mutex
	fail := true
	env := ordersEnv(t, func() bool { failing.Lock(); defer failing.Unlock(); return fail })
	if a := post(env.URL+"/orders", "order-2", `{}`); a.err != nil || a.status < 500 {
		t.Fatalf("failed write answered %d %s (%v); want a 5xx", a.status, a.body, a.err)
	}
	if n := count(t, env, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("the failed write kept %d orders; want none", n)
	}
	if n := count(t, env, `SELECT count(*) FROM operations WHERE key_state IS NOT NULL`); n != 0 {
		t.Fatalf("the failed write kept %d keys; want the key free", n)
	}
	failing.Lock()
	fail = false
	failing.Unlock()
	if a := post(env.URL+"/orders", "order-2", `{}`); a.err != nil || a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry answered %d %v %s (%v); want a fresh 201", a.status, a.header, a.body, a.err)
	}
	if n := count(t, env, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders after the retry; want 1", n)
	}
}
