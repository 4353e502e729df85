package httpserver

import (
	"net/netip"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/metrics"
	"github.com/retrysafe/retrysafe/pkg/ratelimit"
	"github.com/retrysafe/retrysafe/pkg/tracing"
)

// The mechanisms that must see gin's route template or gin's client address, after the chain has answered:
// each speaks net/http for an adopter without gin, and gin reaches it here.

// Metrics is metrics.Middleware on gin: every request of service counted and timed, labelled by gin's route
// template. Give it to Options.Middleware, so it sees the 500 a panic becomes.
func Metrics(m *metrics.Metrics, service string) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		m.Request(service, c.FullPath(), c.Request.Method, c.Writer.Status(), time.Since(start))
	}
}

// Tracing is tracing.Request on gin: a server span per request, a child of the caller's traceparent, named by
// the method and gin's route template, with the status of the answer.
func Tracing(c *gin.Context) {
	if !tracing.Enabled() {
		c.Next()
		return
	}
	ctx, done := tracing.Request(c.Request, c.Request.Method+" "+c.FullPath())
	status := 0 // stays 0 when a handler aborts the connection with a panic: the span then has no status
	defer func() { done(status) }()
	c.Request = c.Request.WithContext(ctx)
	c.Next()
	status = c.Writer.Status()
}

// Failures is ratelimit.Failures' Middleware on gin: it counts each client by gin's ClientIP, which believes
// X-Forwarded-For only from Options.TrustedProxies, and refuses a throttled one with RefuseUnread.
func Failures(f *ratelimit.Failures) gin.HandlerFunc {
	return func(c *gin.Context) {
		client, err := netip.ParseAddr(c.ClientIP())
		if err != nil {
			c.Next() // not a TCP peer (a test's recorder): nothing to count by
			return
		}
		if err := f.Refusal(client); err != nil {
			RefuseUnread(c, err)
			return
		}
		c.Next()
		f.Answered(client, c.Writer.Status())
	}
}
