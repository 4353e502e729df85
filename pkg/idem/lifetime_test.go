package idem_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// TestKeyOutlivesItsResponse: once the stored responses are pruned (the clock moved past their retention of an
// hour, then Prune), a retry with the same key and request runs nothing, in local and in external mode: 409
// idempotency_response_expired naming the operation, its state and its resource. The same key with another
// request is still 422. The operation says when its response and its key expire.
func TestKeyOutlivesItsResponse(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	env.Idem.Retention = time.Hour
	var writes, calls atomic.Int64
	note := func(c *gin.Context) {
		var body map[string]any
		_ = c.ShouldBindJSON(&body)
		idemgin.Do(env.Idem, c, idem.Request{Kind: "test.note", Command: body},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				writes.Add(1)
				return idem.Result{Status: http.StatusCreated, Body: map[string]string{"id": "note_1"},
					Resource: &opstatus.Resource{Type: "note", ID: "note_1"}}, nil
			})
	}
	send := func(c *gin.Context) {
		var body map[string]any
		_ = c.ShouldBindJSON(&body)
		idemgin.DoExternal(env.Idem, c, idem.Request{Kind: "test.send", Command: body}, idem.ExternalSteps[string]{
			Call: func(ctx context.Context, op opstatus.Operation) (string, error) { calls.Add(1); return "sent", nil },
			Record: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, ref string, callErr error) (idem.Result, error) {
				return idem.Result{Status: http.StatusCreated, Body: map[string]string{"ref": ref},
					Resource: &opstatus.Resource{Type: "message", ID: "msg_1"}}, callErr
			},
		})
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) { api.POST("/notes", note); api.POST("/sends", send) }))

	for _, path := range []string{"/notes", "/sends"} {
		if a := post(env.URL+path, "k"+path, `{"n":1}`); a.err != nil || a.status != http.StatusCreated {
			t.Fatalf("%s: first %d %s %v", path, a.status, a.body, a.err)
		}
	}
	env.Clock.Advance(time.Hour + time.Minute)
	responses, keys, err := env.Idem.Prune(t.Context())
	if err != nil || responses != 2 || keys != 0 {
		t.Fatalf("prune: %d responses, %d keys, %v; want 2 responses, no key", responses, keys, err)
	}
	for _, tc := range []struct{ path, resource string }{{"/notes", "note"}, {"/sends", "message"}} {
		a := post(env.URL+tc.path, "k"+tc.path, `{"n":1}`)
		var doc struct {
			Code        string             `json:"code"`
			OperationID string             `json:"operation_id"`
			State       string             `json:"state"`
			Resource    *opstatus.Resource `json:"resource"`
		}
		_ = json.Unmarshal([]byte(a.body), &doc)
		if a.status != http.StatusConflict || doc.Code != "idempotency_response_expired" || doc.State != "succeeded" ||
			doc.Resource == nil || doc.Resource.Type != tc.resource || doc.OperationID == "" || a.header.Get("Retry-After") != "" {
			t.Fatalf("%s retried after the prune: %d %v %s; want 409 idempotency_response_expired naming the operation", tc.path, a.status, a.header, a.body)
		}
		op, err := opstatus.Get(t.Context(), env.DB.Pool, servicetest.AccountDemo, doc.OperationID)
		if err != nil || op.ResponseExpiresAt == nil || op.KeyExpiresAt == nil || !op.KeyExpiresAt.After(time.Now().Add(89*24*time.Hour)) {
			t.Fatalf("%s: operation %+v, %v; want its response and key expiries, the key's 90 days out", tc.path, op, err)
		}
		if b := post(env.URL+tc.path, "k"+tc.path, `{"n":2}`); b.status != http.StatusUnprocessableEntity {
			t.Fatalf("%s: another request under the key after the prune: %d %s; want 422", tc.path, b.status, b.body)
		}
	}
	if writes.Load() != 1 || calls.Load() != 1 {
		t.Fatalf("%d writes, %d calls; want one of each: a pruned response never runs its key again", writes.Load(), calls.Load())
	}
	var expired int64
	env.DB.Raw(`SELECT count(*) FROM operations WHERE key_state = 'expired' AND response_body IS NULL`).Scan(&expired)
	if expired != 2 {
		t.Fatalf("%d expired keys; want 2", expired)
	}
}
