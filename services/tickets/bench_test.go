package tickets_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// BenchmarkCreateTicket measures POST /v1/tickets through the real router on a real PostgreSQL, with parallel
// clients: with idempotency (claim, ticket, stored response and operation in one commit), with it bypassed
// (the bare insert), and a replay of a stored key. Run: make bench.
func BenchmarkCreateTicket(b *testing.B) {
	for _, mode := range []string{"idempotent", "bypassed", "replay"} {
		b.Run(mode, func(b *testing.B) {
			env := servicetest.New(b)
			svc, err := tickets.New(env.Deps, tickets.Config{Bypass: mode == "bypassed"})
			if err != nil {
				b.Fatal(err)
			}
			handler := service.Handler(env.Deps, service.HTTP{Keys: env.Keys}, svc)
			var seq atomic.Int64
			post := func(key string) int {
				req := httptest.NewRequest(http.MethodPost, "/v1/tickets",
					strings.NewReader(`{"project":"bench","title":"Rotate staging certificate","priority":"high"}`))
				req.Header.Set("Authorization", "Bearer "+servicetest.AgentSecret)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				rec := httptest.NewRecorder()
				handler.ServeHTTP(rec, req)
				return rec.Code
			}
			if mode == "replay" && post("replayed-key") != http.StatusCreated {
				b.Fatal("seed request failed")
			}
			b.SetParallelism(4) // 4 x GOMAXPROCS clients
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := "replayed-key"
					if mode != "replay" {
						key = fmt.Sprintf("bench-%d", seq.Add(1))
					}
					if code := post(key); code != http.StatusCreated {
						b.Errorf("status %d", code)
						return
					}
				}
			})
		})
	}
}
