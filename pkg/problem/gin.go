package problem

import (
	"github.com/gin-gonic/gin"
)

// Write renders err as problem+json on c and aborts the handler chain (WriteHTTP, with gin's route template).
func Write(c *gin.Context, err error) {
	c.Abort()
	write(c.Writer, c.Request, c.FullPath(), err)
}
