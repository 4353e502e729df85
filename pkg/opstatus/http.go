package opstatus

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Routes registers GET /v1/operations/{id}, GET /v1/operations/{id}/timeline and
// GET /v1/operations?idempotency_key=K on r, which must be behind auth.Middleware: a caller only ever sees its
// own account's operations. A request that reaches them with no caller is refused (500, logged), never served.
func Routes(r gin.IRouter, db *gorm.DB) {
	r = r.Group("", func(c *gin.Context) {
		if _, ok := auth.Lookup(c); !ok {
			httpserver.WriteProblem(c, problem.New("internal", "the server could not tell who sent this request"))
			c.Abort()
		}
	})
	r.GET("/v1/operations/:id", httpserver.PathID("id", "op_", "operation"), func(c *gin.Context) {
		op, err := Get(c.Request.Context(), db, auth.From(c).AccountID, c.Param("id"))
		if err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		httpserver.JSON(c, http.StatusOK, op)
	})
	r.GET("/v1/operations/:id/timeline", func(c *gin.Context) {
		tl, err := GetTimeline(c.Request.Context(), db, auth.From(c).AccountID, c.Param("id"))
		if err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		httpserver.JSON(c, http.StatusOK, tl)
	})
	r.GET("/v1/operations", func(c *gin.Context) {
		key := c.Query("idempotency_key")
		if msg := checkKey(key); msg != "" {
			httpserver.WriteProblem(c, problem.Validation(problem.FieldError{Field: "idempotency_key", Message: msg}))
			return
		}
		p, err := page.FromQuery(c)
		if err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		ops, err := FindByKeyPage(c.Request.Context(), db, auth.From(c).AccountID, key, p)
		if err != nil {
			httpserver.WriteProblem(c, err)
			return
		}
		httpserver.JSON(c, http.StatusOK, page.Of(ops, p, func(op Operation) page.Cursor { return page.Cursor{At: op.CreatedAt, ID: op.ID} }))
	})
}

// checkKey holds a looked-up key to the rules of the Idempotency-Key header (pkg/idem.ParseKey, which this
// package cannot import): a value no write could have used is refused rather than looked up.
func checkKey(key string) string {
	if key == "" {
		return "is required"
	}
	if len(key) > 255 {
		return "must be 1 to 255 printable ASCII characters"
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "must be 1 to 255 printable ASCII characters"
		}
	}
	return ""
}
