package httpserver_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
)

// TestAccessLogNamesTheRequest: each request is one access log line, which names its attempt, its account when
// it has one, and the operation it answered about; a write logs nothing else, so this line is its record.
func TestAccessLogNamesTheRequest(t *testing.T) {
	var buf bytes.Buffer
	keys, err := auth.ParseKeys("acct_7:agent:agent-secret-0000-0000-0000-0000", "id-secret-0123456789abcdef0123456789")
	if err != nil {
		t.Fatal(err)
	}
	r := httpserver.NewRouter(httpserver.Options{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	r.POST("/v1/things", httpserver.Wrap(auth.Middleware(keys)), func(c *gin.Context) {
		c.Header("Operation-Id", "op_1")
		c.JSON(http.StatusCreated, gin.H{})
	})
	for _, bearer := range []string{"agent-secret-0000-0000-0000-0000", "wrong"} {
		req := httptest.NewRequest(http.MethodPost, "/v1/things", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+bearer)
		r.ServeHTTP(httptest.NewRecorder(), req)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d log lines for 2 requests:\n%s", len(lines), buf.String())
	}
	var ok, refused map[string]any
	if json.Unmarshal([]byte(lines[0]), &ok) != nil || json.Unmarshal([]byte(lines[1]), &refused) != nil {
		t.Fatalf("log lines are not JSON:\n%s", buf.String())
	}
	if ok["msg"] != "request" || ok["account_id"] != "acct_7" || ok["operation_id"] != "op_1" || ok["status"] != float64(201) ||
		ok["attempt_id"] == "" {
		t.Fatalf("access log of an authenticated write: %v", ok)
	}
	if _, named := refused["account_id"]; named || refused["status"] != float64(401) {
		t.Fatalf("access log of a refused request: %v", refused)
	}
}
