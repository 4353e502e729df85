package httpserver_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// guarded is a router whose one route records what its handler saw: CheckURL must let through only clean text.
func guarded(t testing.TB, seen func(id string, q url.Values)) http.Handler {
	r := httpserver.NewRouter(httpserver.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	r.GET("/x/:id", httpserver.CheckURL, func(c *gin.Context) {
		seen(c.Param("id"), c.Request.URL.Query())
		c.JSON(http.StatusOK, gin.H{})
	})
	r.GET("/t/:id", httpserver.CheckURL, httpserver.PathID("id", "tkt_", "ticket"), func(c *gin.Context) {
		c.JSON(http.StatusOK, gin.H{"id": c.Param("id")})
	})
	return r
}

func serve(h http.Handler, path, rawQuery string) (int, string) {
	req := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: path, RawQuery: rawQuery}, Header: http.Header{}, Host: "x"}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var p struct{ Code string }
	_ = json.Unmarshal(rec.Body.Bytes(), &p)
	return rec.Code, p.Code
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	reached := 0
	h := guarded(t, func(string, url.Values) { reached++ })
	for _, tc := range []struct {
		path, query string
		status      int
		code        string
	}{
		{"/x/ok", "a=b", 200, ""},
		{"/x/日本", "q=" + url.QueryEscape("ünï"), 200, ""},
		{"/x/a\x00b", "", 404, "not_found"},
		{"/x/\xff\xfe", "", 404, "not_found"},
		{"/x/a\u202eb", "", 404, "not_found"},
		{"/x/" + string(make([]byte, 300)), "", 404, "not_found"},
		{"/x/ok", "a=%00", 400, "invalid_request"},
		{"/x/ok", "a=%ff%fe", 400, "invalid_request"},
		{"/x/ok", "a=%e2%80%8b", 400, "invalid_request"},
		{"/x/ok", "%00=a", 400, "invalid_request"},
		{"/x/ok", "a=%zz", 400, "invalid_request"},
		{"/x/ok", "a=b;c=d", 400, "invalid_request"},
		{"/t/tkt_0193c1c5-0000-7000-8000-000000000000", "", 200, ""},
		{"/t/tkt_nope", "", 404, "not_found"},
		{"/t/pi_0193c1c5-0000-7000-8000-000000000000", "", 404, "not_found"},
	} {
		status, code := serve(h, tc.path, tc.query)
		if status != tc.status || code != tc.code {
			t.Errorf("GET %q ? %q = %d %q, want %d %q", tc.path, tc.query, status, code, tc.status, tc.code)
		}
	}
	if reached != 2 {
		t.Errorf("the handler ran %d times, want 2 (only for clean URLs)", reached)
	}
}

// FuzzCheckURL: whatever the path segment and query, a handler behind CheckURL sees only text TextFault
// accepts, and the answer is never a 5xx.
func FuzzCheckURL(f *testing.F) {
	for _, s := range [][2]string{{"ok", "a=b"}, {"a\x00", "a=%00"}, {"\xff", "%ff=1"}, {"\u202e", "a=%e2%80%ae"}, {"", ""}, {"x", "a=%zz&b"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, segment, rawQuery string) {
		h := guarded(t, func(id string, q url.Values) {
			if problem.TextFault(id, false) != "" {
				t.Fatalf("handler saw path parameter %q", id)
			}
			for k, vs := range q {
				for _, v := range append(vs, k) {
					if problem.TextFault(v, false) != "" {
						t.Fatalf("handler saw query text %q", v)
					}
				}
			}
		})
		if status, _ := serve(h, "/x/"+segment, rawQuery); status >= 500 {
			t.Fatalf("GET /x/%q?%q = %d", segment, rawQuery, status)
		}
	})
}
