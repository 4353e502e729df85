package httpserver

import (
	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/pkg/urlcheck"
)

// CheckURL is middleware for every API route, before its handlers (internal/service puts it behind authentication):
// it writes the problem URLError finds, so a URL that is not clean text never reaches a handler.
func CheckURL(c *gin.Context) {
	if err := URLError(c); err != nil {
		WriteProblem(c, err)
		return
	}
	c.Next()
}

// URLError checks the path parameters and the query string of c's request: any that is not UTF-8 text without
// control, bidirectional or zero-width characters is refused, so no byte sequence from a URL can reach SQL
// (PostgreSQL refuses NUL and invalid UTF-8 with SQLSTATE 22021, which would be a 500). A bad path parameter
// names nothing that can exist: a not_found problem, as a missing resource. A bad query is invalid_request
// naming the parameter. The problem never quotes the value, so neither an answer nor a log line carries it.
// CheckURL writes it as problem+json; the console renders it as its error page.
func URLError(c *gin.Context) error {
	params := make([]urlcheck.Param, len(c.Params))
	for i, p := range c.Params {
		params[i] = urlcheck.Param{Name: p.Key, Value: p.Value}
	}
	return urlcheck.Check(params, c.Request.URL.RawQuery)
}

// PathID is route middleware for a path parameter that holds an id made by ids.New(prefix): any other value
// is answered 404 "<resource> not found" before the handler runs, as a missing id is.
//
//	r.GET("/v1/tickets/:id", httpserver.PathID("id", "tkt_", "ticket"), s.getTicket)
func PathID(param, prefix, resource string) gin.HandlerFunc {
	return PathParam(param, resource, func(v string) bool { return ids.Valid(prefix, v) })
}

// PathParam is PathID for a parameter with its own format (an environment name): a value valid refuses is
// 404 "<resource> not found".
func PathParam(param, resource string, valid func(string) bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !valid(c.Param(param)) {
			WriteProblem(c, problem.NotFound(resource))
			return
		}
		c.Next()
	}
}
