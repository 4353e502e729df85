package opstatus

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Routes registers GET /v1/operations/{id}, GET /v1/operations/{id}/timeline and
// GET /v1/operations?idempotency_key=K on r, which must be
// behind auth.Middleware: a caller only ever sees its own account's operations.
func Routes(r gin.IRouter, db *gorm.DB) {
	r.GET("/v1/operations/:id", func(c *gin.Context) {
		op, err := Get(c.Request.Context(), db, auth.From(c).AccountID, c.Param("id"))
		if err != nil {
			problem.Write(c, err)
			return
		}
		c.JSON(http.StatusOK, op)
	})
	r.GET("/v1/operations/:id/timeline", func(c *gin.Context) {
		tl, err := GetTimeline(c.Request.Context(), db, auth.From(c).AccountID, c.Param("id"))
		if err != nil {
			problem.Write(c, err)
			return
		}
		c.JSON(http.StatusOK, tl)
	})
	r.GET("/v1/operations", func(c *gin.Context) {
		key := c.Query("idempotency_key")
		if key == "" {
			problem.Write(c, problem.Validation(problem.FieldError{Field: "idempotency_key", Message: "is required"}))
			return
		}
		ops, err := FindByKey(c.Request.Context(), db, auth.From(c).AccountID, key)
		if err != nil {
			problem.Write(c, err)
			return
		}
		c.JSON(http.StatusOK, gin.H{"items": ops})
	})
}
