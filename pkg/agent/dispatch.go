package agent

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// dispatch is what one attempt's connection reports: whether the request was written, and the after_send hook
// to run once its bytes left the process.
type dispatch struct {
	wrote atomic.Bool
	once  sync.Once
	hook  func()
}

type dispatchKey struct{}

// watchedConn runs the attempt's after_send hook after the first Write that follows WroteRequest: the flush
// that puts the end of the request on the wire.
type watchedConn struct {
	net.Conn
	d *dispatch
}

func (c *watchedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil && c.d.wrote.Load() {
		c.d.once.Do(c.d.hook)
	}
	return n, err
}

// newTransport is the default transport: a new connection per request, because net/http silently resends a
// request that carries Idempotency-Key when a reused connection turns out dead, and the journal must see every
// send; and connections that report when a request's bytes left.
func newTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if d, ok := ctx.Value(dispatchKey{}).(*dispatch); ok {
			return &watchedConn{Conn: c, d: d}, nil
		}
		return c, nil
	}
	return tr
}
