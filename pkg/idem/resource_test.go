package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// lockedBuffer is a log destination the handler's goroutines share with the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestWriteWithoutResourceIsToldOnce: a write that succeeds without Result.Resource leaves a pruned key's 409
// nothing to point at, so the operator is told, once per kind, in the log; a write that names its resource is
// never told.
func TestWriteWithoutResourceIsToldOnce(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t)
	var logs lockedBuffer
	env.Idem.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	write := func(kind string, resource bool) gin.HandlerFunc {
		return func(c *gin.Context) {
			var body map[string]any
			_ = c.ShouldBindJSON(&body)
			idemgin.Do(env.Idem, c, idem.Request{Kind: kind, Command: body},
				func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
					res := idem.Result{Status: http.StatusCreated, Body: map[string]string{"id": "x_" + op.ID}}
					if resource {
						res.Resource = &opstatus.Resource{Type: "x", ID: "x_" + op.ID}
					}
					return res, nil
				})
		}
	}
	env.Serve(t, servicetest.Routes(func(api gin.IRouter) {
		api.POST("/bare", write("test.bare", false))
		api.POST("/named", write("test.named", true))
	}))
	for i := range 3 {
		for _, path := range []string{"/bare", "/named"} {
			if a := post(env.URL+path, fmt.Sprintf("k%s%d", path, i), `{"n":1}`); a.err != nil || a.status != http.StatusCreated {
				t.Fatalf("%s: %d %s %v", path, a.status, a.body, a.err)
			}
		}
	}
	out := logs.String()
	if n := strings.Count(out, "without Result.Resource"); n != 1 || !strings.Contains(out, `"kind":"test.bare"`) {
		t.Errorf("warnings about a missing Resource = %d (test.bare told: %v); want exactly 1, for test.bare:\n%s",
			n, strings.Contains(out, `"kind":"test.bare"`), out)
	}
	if strings.Contains(out, `"kind":"test.named"`) {
		t.Errorf("a write that names its resource was warned about:\n%s", out)
	}
}
