package payments

import (
	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/httpserver"
)

// Route templates that approvals bind to.
const (
	routeCapture = "/v1/payment_intents/:id/capture"
	routeRefunds = "/v1/payment_intents/:id/refunds"
)

// Routes registers every endpoint of the payments service on r, which must be behind auth.Middleware: payment
// intents, refunds and the approvals of its captures and refunds (package service serves the operations routes
// beside them).
func (s *Server) Routes(r gin.IRouter) {
	r.POST("/v1/payment_intents", s.createIntent)
	intent := httpserver.PathID("id", "pi_", "payment intent")
	r.GET("/v1/payment_intents/:id", intent, s.getIntent)
	r.POST(routeCapture, intent, s.capture)
	r.POST("/v1/payment_intents/:id/cancel", intent, s.cancel)
	r.POST(routeRefunds, intent, s.createRefund)
	r.GET(routeRefunds, intent, s.listRefunds)
	r.GET("/v1/refunds/:id", httpserver.PathID("id", "re_", "refund"), s.getRefund)
	httpserver.Mount(r, s.approvals.Routes())
}
