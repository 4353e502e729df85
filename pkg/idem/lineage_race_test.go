package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// sendTogether sends n requests at once (released together) and returns their answers in order; request i
// has the key and headers of req(i).
func sendTogether(t *testing.T, url, body string, n int, req func(i int) (string, map[string]string)) []answer {
	t.Helper()
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		key, headers := req(i)
		wg.Go(func() {
			<-start
			answers[i] = send(url, key, body, headers)
		})
	}
	close(start)
	wg.Wait()
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("request %d: %v", i, a.err)
		}
	}
	return answers
}

// TestOneSuccessorUnderConcurrency: ten creates under ten keys, each naming one operation in
// Supersedes-Operation-Id, race. Each write holds its transaction until every other copy has either reached its
// own write (no database check stopped it) or waits for this one's transaction (the database holds it back):
// all ten are past the check of the superseded operation before any commits. Exactly one is created and
// supersedes it; the other nine are refused naming the header, and leave no operation and no event.
func TestOneSuccessorUnderConcurrency(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	const copies = 10
	var inWrite atomic.Int64
	notes := func(c *gin.Context) {
		var body map[string]any
		_ = c.ShouldBindJSON(&body)
		idemgin.Do(env.Idem, c, idem.Request{Kind: "test.note", Command: body},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				if body["n"] != float64(0) {
					inWrite.Add(1)
					var pid int64
					if err := tx.Raw(`SELECT pg_backend_pid()`).Scan(&pid).Error; err != nil {
						return idem.Result{}, err
					}
					// A synchronisation point, not a timing assertion: the bound only ends a test that went wrong.
					for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
						var blocked int64
						env.DB.Raw(`SELECT count(*) FROM pg_stat_activity WHERE ? = ANY(pg_blocking_pids(pid))`, pid).Scan(&blocked)
						if inWrite.Load()-1+blocked >= copies-1 {
							break
						}
						if time.Now().After(deadline) {
							return idem.Result{}, errors.New("the other copies neither reached their write nor waited for this one")
						}
					}
				}
				return idem.Result{Status: http.StatusCreated, Body: map[string]string{"op": op.ID}}, nil
			})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/notes", notes) }))
	url := env.URL + "/notes"
	first := send(url, "old", `{"n":0}`, nil)
	if first.status != http.StatusCreated {
		t.Fatalf("setup: %d %s", first.status, first.body)
	}
	old := first.header.Get("Operation-Id")

	answers := sendTogether(t, url, `{"n":1}`, copies, func(i int) (string, map[string]string) {
		return fmt.Sprintf("successor-%d", i), map[string]string{idem.HeaderSupersedes: old}
	})
	created := 0
	for i, a := range answers {
		switch {
		case a.status == http.StatusCreated:
			created++
		case a.status != http.StatusBadRequest || !strings.Contains(a.body, `"header":"Supersedes-Operation-Id"`) ||
			!strings.Contains(a.body, "already superseded"):
			t.Errorf("copy %d: %d %s; want 201 or 400 naming Supersedes-Operation-Id", i, a.status, a.body)
		}
	}
	var superseded, ops int64
	env.DB.Raw(`SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = ?`, old, opstore.EventSuperseded).Scan(&superseded)
	env.DB.Raw(`SELECT count(*) FROM operations`).Scan(&ops)
	if created != 1 || superseded != 1 || ops != 2 {
		t.Fatalf("%d created, %d superseded events, %d operations; want 1, 1 and 2 (the old one and its one successor)", created, superseded, ops)
	}
}

// TestAttemptIDUsedOnceUnderConcurrency: three retries of one operation race with one Attempt-Id and no
// Retry-Of. One is answered (the replay) and recorded under that id; the two others are refused naming
// Attempt-Id, recorded as refused without claiming the id. A later retry with the id is refused too, and one
// with an id of its own is replayed.
func TestAttemptIDUsedOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) {
		api.POST("/notes", func(c *gin.Context) {
			idemgin.Do(env.Idem, c, idem.Request{Kind: "test.note", Command: map[string]any{}},
				func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
					return idem.Result{Status: http.StatusCreated, Body: map[string]string{"op": op.ID}}, nil
				})
		})
	}))
	url := env.URL + "/notes"
	first := send(url, "k", `{}`, map[string]string{"Attempt-Id": "att_first"})
	if first.status != http.StatusCreated {
		t.Fatalf("setup: %d %s", first.status, first.body)
	}
	answers := sendTogether(t, url, `{}`, 3, func(int) (string, map[string]string) {
		return "k", map[string]string{"Attempt-Id": "att_same"}
	})
	replayed := 0
	for i, a := range answers {
		switch {
		case a.status == http.StatusCreated && a.header.Get("Idempotent-Replayed") == "true":
			replayed++
		case a.status != http.StatusBadRequest || !strings.Contains(a.body, `"header":"Attempt-Id"`):
			t.Errorf("retry %d: %d %s; want the replay or 400 naming Attempt-Id", i, a.status, a.body)
		}
	}
	if a := send(url, "k", `{}`, map[string]string{"Attempt-Id": "att_same"}); a.status != http.StatusBadRequest || !strings.Contains(a.body, `"header":"Attempt-Id"`) {
		t.Errorf("a later retry with the used id: %d %s; want 400 naming Attempt-Id", a.status, a.body)
	}
	if a := send(url, "k", `{}`, map[string]string{"Attempt-Id": "att_own"}); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry with its own id: %d %s; want the replay", a.status, a.body)
	}
	var records, refused int64
	env.DB.Raw(`SELECT count(*) FROM operation_events WHERE outcome IS NOT NULL AND attempt_id = 'att_same'`).Scan(&records)
	env.DB.Raw(`SELECT count(*) FROM operation_events WHERE type = ? AND detail->>'repeated_attempt_id' = 'att_same'
  AND detail->>'refusal' = 'attempt_id_used'`, opstore.EventAttemptRefused).Scan(&refused)
	if replayed != 1 || records != 1 || refused != 3 {
		t.Fatalf("%d replayed, %d attempt records of att_same, %d refusals; want 1, 1 and 3", replayed, records, refused)
	}
}
