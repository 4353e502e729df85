package tickets

import (
	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/httpserver"
)

// Routes registers every endpoint of the tickets service on r, which must be behind auth.Middleware.
func (s *Server) Routes(r gin.IRouter) {
	r.POST("/v1/tickets", s.createTicket)
	r.GET("/v1/tickets", s.listTickets)
	ticket := httpserver.PathID("id", "tkt_", "ticket")
	r.GET("/v1/tickets/:id", ticket, s.getTicket)
	r.POST("/v1/tickets/:id/comments", ticket, s.addComment)
	r.GET("/v1/tickets/:id/comments", ticket, s.listComments)
	r.PUT("/v1/tickets/:id/status", ticket, s.setStatus)
	r.GET("/v1/tickets/:id/status_changes", ticket, s.listStatusChanges)
	httpserver.Mount(r, s.Approvals.Routes())
}
