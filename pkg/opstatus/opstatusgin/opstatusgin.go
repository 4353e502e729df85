// Package opstatusgin mounts the operations routes of package opstatus (an http.Handler) on a gin router. The
// core packages speak net/http; each gin adapter sits beside the package it adapts, named <package>gin
// (idemgin, opstatusgin), and httpserver holds the gin plumbing they share.
//
//	opstatusgin.Routes(api, db) // api is behind auth.Middleware (httpserver.Wrap)
package opstatusgin

import (
	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// Routes registers opstatus.Handler's routes on r: GET /v1/operations/:id, GET /v1/operations/:id/timeline and
// GET /v1/operations.
func Routes(r gin.IRouter, db *gorm.DB) {
	h := gin.WrapH(opstatus.Handler(db))
	r.GET("/v1/operations/:id", h)
	r.GET("/v1/operations/:id/timeline", h)
	r.GET("/v1/operations", h)
}
