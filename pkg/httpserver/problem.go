package httpserver

import (
	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

// WriteProblem renders err as problem+json on c and aborts the handler chain: problem.Write, with gin's route
// template in the log line.
func WriteProblem(c *gin.Context, err error) {
	c.Abort()
	c.Request.Pattern = c.FullPath()
	problem.Write(c.Writer, c.Request, err)
}

// RefuseUnread is WriteProblem for a refusal made before the request body is read (a throttled client), after
// problem.CloseUnread.
func RefuseUnread(c *gin.Context, err error) {
	problem.CloseUnread(c.Writer, c.Request)
	WriteProblem(c, err)
}
