package httpserver

import (
	"maps"
	"net/http"
	"slices"
	"strings"

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

// Wrap mounts net/http middleware (auth.Middleware, auth.AgentWrites, ratelimit's Limiter) in a gin chain. The request it sees
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

// Mount registers net/http handlers keyed by ServeMux pattern ("GET /v1/operations/{id}", as opstatus.Routes
// and approval's Service.Routes give them) on r as gin routes ("/v1/operations/:id"). gin routes; the handler
// gets the request as a ServeMux would pass it, its Pattern and path values set, and is not routed again.
func Mount(r gin.IRouter, routes map[string]http.Handler) {
	for _, pattern := range slices.Sorted(maps.Keys(routes)) {
		method, path, _ := strings.Cut(pattern, " ")
		h := routes[pattern]
		r.Handle(method, ginPath(path), func(c *gin.Context) {
			c.Request.Pattern = pattern
			for _, p := range c.Params {
				c.Request.SetPathValue(p.Key, p.Value)
			}
			h.ServeHTTP(c.Writer, c.Request)
		})
	}
}

// ginPath is the gin template of a ServeMux path: {name} is :name, {name...} is *name.
func ginPath(path string) string {
	segments := strings.Split(path, "/")
	for i, s := range segments {
		name, ok := strings.CutPrefix(s, "{")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(name, "}")
		if rest, ok := strings.CutSuffix(name, "..."); ok {
			segments[i] = "*" + rest
		} else {
			segments[i] = ":" + name
		}
	}
	return strings.Join(segments, "/")
}
