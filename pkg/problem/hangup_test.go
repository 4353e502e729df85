package problem_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

// TestCallerHangUpIsNotAServerError: an error caused by the caller hanging up (its request's context canceled)
// is answered as a store failure that did nothing, never a 500, and logged at INFO, not as an ERROR; the same
// error while the caller still listens is the server's, a 500 with an ERROR line.
func TestCallerHangUpIsNotAServerError(t *testing.T) {
	var logs bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	err := fmt.Errorf("lock environment: %w", context.Canceled)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := httptest.NewRecorder()
	problem.Write(w, httptest.NewRequest(http.MethodPost, "/v1/deploys", nil).WithContext(ctx), err)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), `"code":"store_unavailable"`) {
		t.Fatalf("hung up: %d %s; want 503 store_unavailable", w.Code, w.Body)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("a caller's hang-up logged an ERROR: %s", logs.String())
	}

	logs.Reset()
	w = httptest.NewRecorder()
	problem.Write(w, httptest.NewRequest(http.MethodPost, "/v1/deploys", nil), err)
	if w.Code != http.StatusInternalServerError || !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("still listening: %d, logs %q; want a 500 with an ERROR line", w.Code, logs.String())
	}
}
