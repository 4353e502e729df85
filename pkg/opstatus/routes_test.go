package opstatus_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// TestRoutesWithoutACallerRefuse: the operations routes mounted without auth.Middleware (a wiring mistake)
// answer each request with a 500 problem; nothing panics (the router here has no recovery) and nothing is read.
func TestRoutesWithoutACallerRefuse(t *testing.T) {
	t.Parallel()
	r := http.NewServeMux()
	for pattern, h := range opstatus.Routes(testdb.Schema(t).Pool) {
		r.Handle(pattern, h)
	}
	for _, path := range []string{"/v1/operations/op_x", "/v1/operations/op_x/timeline", "/v1/operations?idempotency_key=k"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), `"code":"internal"`) {
			t.Errorf("GET %s: %d %s; want a 500 problem", path, w.Code, w.Body)
		}
	}
}
