package httpserver

import (
	"net/netip"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/ratelimit"
	"github.com/retrysafe/retrysafe/pkg/tracing"
)

// The mechanisms that must see gin's route template or gin's client address, after the chain has answered:
// each speaks net/http for an adopter without gin, and gin reaches it here.

// Metrics counts and times every request of service on gin, labelled by gin's route template: record is
// metrics.Metrics' Request (httpserver.Metrics("tickets", m.Request)), the net/http Middleware's own counter.
// It takes the function, not the Metrics, so that a gin service without Prometheus links none. Give it to
// Options.Middleware, so it sees the 500 a panic becomes.
func Metrics(service string, record func(service, route, method string, status int, took time.Duration)) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		record(service, c.FullPath(), c.Request.Method, c.Writer.Status(), time.Since(start))
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
