package deploys

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
)

// Routes of the writes that take approvals; ApprovalRoutes and Routes share them.
const (
	pathDeploys  = "/v1/deploys"
	pathRollback = "/v1/deploys/:id/rollback"
)

// Routes registers every endpoint of the deploys service on r, which must be behind auth.Middleware: deploys,
// environments and the approvals of its own writes (package service serves the operations routes beside them).
func (s *Server) Routes(r gin.IRouter) {
	r.POST(pathDeploys, s.createDeploy)
	deploy := httpserver.PathID("id", "dep_", "deploy")
	r.GET("/v1/deploys/:id", deploy, s.getDeploy)
	r.POST("/v1/deploys/:id/cancel", deploy, s.cancelDeploy)
	r.POST(pathRollback, deploy, s.rollbackDeploy)
	r.GET("/v1/environments/:name", httpserver.PathParam("name", "environment", namePattern.MatchString), s.getEnvironment)
	httpserver.Mount(r, s.Approvals.Routes())
}

// ApprovalRoutes are the writes of the service that can need a person's approval, for approval.New.
func (s *Server) ApprovalRoutes() []approval.Route {
	return []approval.Route{
		{Method: http.MethodPost, Path: pathDeploys, Describe: s.describeDeploy},
		{Method: http.MethodPost, Path: pathRollback, Describe: s.describeRollback},
	}
}
