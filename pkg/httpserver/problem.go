package httpserver

import (
	"net/http"

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

// Wrap mounts net/http middleware (auth.Middleware, auth.AgentWrites) in a gin chain. The request it sees
// carries gin's route template as its Pattern; when mw calls its next handler, the chain goes on with the
// request mw passed (its context holds what mw added); when mw answers instead, the chain stops.
func Wrap(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		c.Request.Pattern = c.FullPath()
		passed := false
		mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			passed = true
			c.Request = r
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
		if !passed {
			c.Abort()
		}
	}
}
