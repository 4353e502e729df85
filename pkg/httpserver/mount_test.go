package httpserver_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/httpserver"
)

// TestMountRoutesOnce: a net/http route mounted on gin gets the request as a ServeMux would pass it (its
// pattern, its path values) and is not routed a second time, so a path parameter a ServeMux would clean away
// ("..", "."), which gin takes as a value, reaches the handler, which answers it, instead of a redirect.
func TestMountRoutesOnce(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.TestMode)
	r := gin.New()
	var seen []string
	httpserver.Mount(r, map[string]http.Handler{
		"GET /v1/things/{id}/parts": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = append(seen, r.Pattern+" id="+r.PathValue("id"))
			w.WriteHeader(http.StatusNotFound)
		}),
	})
	for _, path := range []string{"/v1/things/t1/parts", "/v1/things/../parts", "/v1/things/%2e%2e/parts", "/v1/things/./parts"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != http.StatusNotFound || w.Header().Get("Location") != "" {
			t.Errorf("GET %s: %d, Location %q; want the handler's 404", path, w.Code, w.Header().Get("Location"))
		}
	}
	want := []string{"GET /v1/things/{id}/parts id=t1", "GET /v1/things/{id}/parts id=..", "GET /v1/things/{id}/parts id=..", "GET /v1/things/{id}/parts id=."}
	if len(seen) != len(want) {
		t.Fatalf("the handler saw %q; want %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("request %d: the handler saw %q; want %q", i, seen[i], want[i])
		}
	}
}
