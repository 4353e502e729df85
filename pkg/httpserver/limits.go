package httpserver

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/pkg/ratelimit"
)

// Defaults of Limits.
const (
	DefaultMaxConns          = 1024
	DefaultMaxConnsPerClient = 64
	DefaultIdleTimeout       = 30 * time.Second
)

// Limits bound what clients can hold of a server, so that no client, with a key or without, can take the
// file descriptors every account needs. Zero MaxConns and IdleTimeout take the defaults above; a zero
// MaxConnsPerClient caps nothing (cmd/retrysafe sets DefaultMaxConnsPerClient).
type Limits struct {
	// MaxConns caps the connections a listener holds open at once. When all are taken, a new connection
	// closes the one idle longest between requests (a keep-alive that may never send again); with none idle it
	// waits for one to close, and those after it wait, unaccepted, in the kernel's backlog.
	MaxConns int
	// MaxConnsPerClient caps the connections of one client address (ratelimit.ClientPrefix); a connection beyond it is
	// closed as soon as it is accepted. Connections from loopback and from TrustedProxies are not counted:
	// they carry many clients (a proxy in front, the load harness), whom a cap on the peer address would lock
	// out together. Behind another proxy, list it in TrustedProxies.
	MaxConnsPerClient int
	// IdleTimeout closes a keep-alive connection idle that long.
	IdleTimeout time.Duration
	// TrustedProxies are the proxies in front of the server (see Options.TrustedProxies).
	TrustedProxies []netip.Prefix
}

func (l Limits) withDefaults() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	return l
}

// newServer is the http.Server of ServeListener. ReadHeaderTimeout bounds a client that never finishes its
// headers, ReadTimeout a whole request with its body, WriteTimeout the answer (above the longest Prefer: wait,
// 30 s), IdleTimeout a keep-alive connection between requests.
func newServer(handler http.Handler, logger *slog.Logger, l Limits) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       l.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// limitListener applies l's connection caps to ln; exempt says which peers the per-client cap leaves out. The
// server must report its connections' states to the listener's connState (http.Server.ConnState).
func limitListener(ln net.Listener, l Limits, exempt func(netip.Addr) bool) *connLimiter {
	if l.MaxConnsPerClient > 0 {
		ln = &perClientListener{Listener: ln, max: l.MaxConnsPerClient, exempt: exempt, open: map[netip.Prefix]int{}}
	}
	// Outermost, so a connection the per-client cap closes never holds a place under MaxConns.
	return &connLimiter{Listener: ln, slots: make(chan struct{}, l.MaxConns), idle: map[*limitedConn]time.Time{},
		wentIdle: make(chan struct{}, 1), closed: make(chan struct{})}
}

// connLimiter holds at most cap(slots) connections open: MaxConns bounds the file descriptors clients can take.
// A slot is held by a connection, but an idle keep-alive connection holds it only until someone else needs it:
// a connection accepted while every slot is taken closes the connection idle longest, as IdleTimeout would
// have later. Without that, clients that send one request needing no key (GET /healthz) on each connection and
// then keep it open would hold every slot for the whole idle timeout, and a real request would wait for it.
// Closing an idle connection loses nothing: no request is on it, and the client opens another when it needs
// one. A connection in a request is never closed for another; with none idle, the new one waits for a slot.
type connLimiter struct {
	net.Listener
	slots chan struct{}

	mu       sync.Mutex
	idle     map[*limitedConn]time.Time // since when each idle connection is idle
	wentIdle chan struct{}              // a token when a connection goes idle
	closed   chan struct{}
	once     sync.Once
}

func (l *connLimiter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for {
		select {
		case l.slots <- struct{}{}:
			return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
		}
		if l.closeLongestIdle() {
			continue
		}
		select {
		case l.slots <- struct{}{}:
			return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
		case <-l.wentIdle:
		case <-l.closed:
			c.Close()
			return nil, net.ErrClosed
		}
	}
}

func (l *connLimiter) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// connState follows the server's connections: which are idle, between requests, and since when.
func (l *connLimiter) connState(c net.Conn, state http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if state != http.StateIdle {
		delete(l.idle, lc)
		return
	}
	l.idle[lc] = time.Now()
	select {
	case l.wentIdle <- struct{}{}:
	default:
	}
}

// closeLongestIdle closes the connection idle longest, which frees its slot, and reports whether there was one.
func (l *connLimiter) closeLongestIdle() bool {
	l.mu.Lock()
	var oldest *limitedConn
	for c, since := range l.idle {
		if oldest == nil || since.Before(l.idle[oldest]) {
			oldest = c
		}
	}
	delete(l.idle, oldest)
	l.mu.Unlock()
	if oldest == nil {
		return false
	}
	oldest.Close()
	return true
}

// limitedConn gives its slot back when it is closed, by the server or by connLimiter.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// exemptPeer is the exemption of Limits.MaxConnsPerClient: loopback and the trusted proxies.
func exemptPeer(trusted []netip.Prefix) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		if a.IsLoopback() {
			return true
		}
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
}

// perClientListener closes, as soon as it is accepted, a connection from a client that already holds max.
type perClientListener struct {
	net.Listener
	max    int
	exempt func(netip.Addr) bool

	mu   sync.Mutex
	open map[netip.Prefix]int
}

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
		if err != nil || l.exempt(ap.Addr().Unmap()) {
			return c, nil
		}
		client := ratelimit.ClientPrefix(ap.Addr())
		l.mu.Lock()
		full := l.open[client] >= l.max
		if !full {
			l.open[client]++
		}
		l.mu.Unlock()
		if full {
			c.Close()
			continue
		}
		return &clientConn{Conn: c, release: func() { l.release(client) }}, nil
	}
}

func (l *perClientListener) release(client netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[client]--; l.open[client] <= 0 {
		delete(l.open, client)
	}
}

type clientConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
