package tickets

import (
	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// Routes registers every endpoint of the tickets service on r, which must be behind auth.Middleware.
func (s *Server) Routes(r gin.IRouter) {
	r.POST("/v1/tickets", s.createTicket)
	r.GET("/v1/tickets", s.listTickets)
	r.GET("/v1/tickets/:id", s.getTicket)
	r.POST("/v1/tickets/:id/comments", s.addComment)
	r.GET("/v1/tickets/:id/comments", s.listComments)
	r.PUT("/v1/tickets/:id/status", s.setStatus)
	r.GET("/v1/tickets/:id/status_changes", s.listStatusChanges)
	opstatus.Routes(r, s.DB)
}
