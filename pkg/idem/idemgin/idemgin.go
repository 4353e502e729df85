// Package idemgin runs pkg/idem's idempotent writes in gin handlers: it builds the idem.Call from the
// *gin.Context (route template, path parameters, headers, the principal of auth.Middleware, the Attempt-Id of
// httpserver's middleware) and writes the idem.Answer on it.
//
//	r.POST("/v1/notes", func(c *gin.Context) {
//		var cmd createNote // decoded and validated first: a refused request never burns the key
//		...
//		idemgin.Do(h, c, idem.Request{Kind: "notes.create", Command: cmd}, write)
//	})
package idemgin

import (
	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/idem"
)

// Do is idem.Handler.Run for c.
func Do(h *idem.Handler, c *gin.Context, req idem.Request, write idem.WriteFunc) {
	Write(c, h.Run(c.Request.Context(), Call(c), req, write))
}

// DoExternal is idem.RunExternal for c.
func DoExternal[T any](h *idem.Handler, c *gin.Context, req idem.Request, steps idem.ExternalSteps[T]) {
	Write(c, idem.RunExternal(c.Request.Context(), h, Call(c), req, steps))
}

// Call is the idem.Call of c. The caller is auth.Middleware's principal or, for a service with its own
// authentication, the one idem.WithCaller put in the request's context; a request with neither is refused.
func Call(c *gin.Context) idem.Call {
	params := make(map[string]string, len(c.Params))
	for _, p := range c.Params {
		params[p.Key] = p.Value
	}
	caller, _ := idem.CallerFrom(c.Request.Context())
	if p, ok := auth.Lookup(c.Request.Context()); ok {
		caller = idem.Caller{AccountID: p.AccountID, Actor: p.Actor()}
	}
	return idem.Call{Method: c.Request.Method, Route: c.FullPath(), Params: params, Header: c.Request.Header,
		Caller: caller, AttemptID: httpserver.AttemptID(c)}
}

// Write writes a on c.
func Write(c *gin.Context, a idem.Answer) {
	for name, values := range a.Header {
		c.Writer.Header()[name] = values
	}
	if a.Err != nil {
		httpserver.WriteProblem(c, a.Err)
		return
	}
	c.Data(a.Status, a.Header.Get("Content-Type"), a.Body)
}
