package problem

import (
	"net/http"
	"time"
)

// CloseUnread makes the answer on w, about to be written, say Connection: close, and leaves what is left of the
// request body unread. net/http would otherwise read up to 256 KiB of an unread body after the handler, to
// keep the connection, so a client that announces a large body and sends it slowly would hold its connection
// until the read timeout before it even saw the refusal. Call it, then Write, when refusing a client that has
// not shown a key or is throttled (the console's pages render their own refusal after it).
func CloseUnread(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	if r.Body != nil && r.Body != http.NoBody {
		// A read deadline already past makes the server's read of the rest of the body fail at once. A request
		// without a body keeps its deadline: the server's background read of the connection would take a
		// passed one for a client that hung up.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
}
