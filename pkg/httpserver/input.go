package httpserver

import (
	"net/url"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Limits on what a URL may carry. Ids are 40-odd characters and names at most 63; nothing a route takes comes
// near these, so only a hostile or broken caller meets them.
const (
	MaxPathParamLength  = 255
	MaxQueryValueLength = 1024
)

// CheckURL is middleware for every API route, before its handlers (pkg/service puts it behind authentication):
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
	for _, p := range c.Params {
		if len(p.Value) > MaxPathParamLength || problem.TextFault(p.Value, false) != "" {
			return problem.New("not_found", "nothing is found at this path: the %s is malformed", p.Key)
		}
	}
	if c.Request.URL.RawQuery == "" {
		return nil
	}
	query, err := url.ParseQuery(c.Request.URL.RawQuery)
	if err != nil {
		return problem.New("invalid_request", "the query string is malformed: send name=value pairs separated by & and percent-encoded")
	}
	for name, values := range query {
		if len(name) > MaxQueryValueLength || problem.TextFault(name, false) != "" {
			return problem.New("invalid_request", "a query parameter name is not UTF-8 text without control characters")
		}
		for _, v := range values {
			if len(v) > MaxQueryValueLength {
				return problem.New("invalid_request", "query parameter %q is longer than %d bytes", name, MaxQueryValueLength)
			}
			if fault := problem.TextFault(v, false); fault != "" {
				return problem.New("invalid_request", "query parameter %q %s", name, fault)
			}
		}
	}
	return nil
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
