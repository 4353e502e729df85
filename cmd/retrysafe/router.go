package main

import "github.com/gin-gonic/gin"

// httpserverRouter is a service's engine and its authenticated route group.
type httpserverRouter struct {
	Engine *gin.Engine
	API    *gin.RouterGroup
}
