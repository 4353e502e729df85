package idemgin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemgin"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// TestCallerOfOwnAuthentication: a gin service with its own authentication names the caller with
// idem.WithCaller; idemgin runs its write under that account (a replay for the same key, the operation in the
// caller's account), and refuses a request whose caller nobody named.
func TestCallerOfOwnAuthentication(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t, servicetest.GormDefaults())
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.Use(func(c *gin.Context) {
		if c.GetHeader("X-User") != "" {
			c.Request = c.Request.WithContext(idem.WithCaller(c.Request.Context(),
				idem.Caller{AccountID: "acct_" + c.GetHeader("X-User"), Actor: "user:" + c.GetHeader("X-User")}))
		}
	})
	r.POST("/v1/things", func(c *gin.Context) {
		idemgin.Do(env.Idem, c, idem.Request{Kind: "things.create", Command: map[string]any{}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				return idem.Result{Status: http.StatusCreated, Body: map[string]string{"op": op.ID}}, nil
			})
	})
	send := func(user string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/things", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k1")
		if user != "" {
			req.Header.Set("X-User", user)
		}
		r.ServeHTTP(w, req)
		return w
	}
	first, again, anonymous := send("ann"), send("ann"), send("")
	if first.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() {
		t.Fatalf("first %d %s, again %d %v %s; want 201 then its replay", first.Code, first.Body, again.Code, again.Header(), again.Body)
	}
	if anonymous.Code != http.StatusInternalServerError || !strings.Contains(anonymous.Body.String(), `"code":"internal"`) {
		t.Fatalf("no caller: %d %s; want a 500 problem", anonymous.Code, anonymous.Body)
	}
	var n int64
	env.DB.Raw(`SELECT count(*) FROM operations WHERE account_id = 'acct_ann' AND kind = 'things.create'`).Scan(&n)
	if n != 1 {
		t.Fatalf("%d operations in the caller's account; want 1", n)
	}
}
