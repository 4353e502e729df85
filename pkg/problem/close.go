package problem

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
)

// WriteAndClose is Write for a refusal made before the request body is read (no API key or an unknown one, a
// throttled client), after CloseUnread.
func WriteAndClose(c *gin.Context, err error) {
	CloseUnread(c)
	Write(c, err)
}

// CloseUnread makes the answer to c, about to be written, say Connection: close, and leaves what is left of the
// request body unread. net/http would otherwise read up to 256 KiB of an unread body after the handler, to
// keep the connection, so a client that announces a large body and sends it slowly would hold its connection
// until the read timeout before it even saw the refusal. Call it when refusing a client that has not shown a
// key (the console's pages render their own refusal after it).
func CloseUnread(c *gin.Context) {
	c.Header("Connection", "close")
	if c.Request.Body != nil && c.Request.Body != http.NoBody {
		// A read deadline already past makes the server's read of the rest of the body fail at once. A request
		// without a body keeps its deadline: the server's background read of the connection would take a
		// passed one for a client that hung up.
		_ = http.NewResponseController(c.Writer).SetReadDeadline(time.Now())
	}
}
