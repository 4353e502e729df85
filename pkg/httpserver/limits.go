package httpserver

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/netutil"
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
	// MaxConns caps the connections a listener holds open at once. More wait, unaccepted, in the kernel's
	// backlog until one closes.
	MaxConns int
	// MaxConnsPerClient caps the connections of one client address (ClientPrefix); a connection beyond it is
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

// ClientPrefix is the address limits count a client by: an IPv4 address, or the /64 of an IPv6 address, which
// one host usually holds whole.
func ClientPrefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
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

// limitListener applies l's connection caps to ln; exempt says which peers the per-client cap leaves out.
func limitListener(ln net.Listener, l Limits, exempt func(netip.Addr) bool) net.Listener {
	if l.MaxConnsPerClient > 0 {
		ln = &perClientListener{Listener: ln, max: l.MaxConnsPerClient, exempt: exempt, open: map[netip.Prefix]int{}}
	}
	// Outermost, so a connection the per-client cap closes never holds a place under MaxConns.
	return netutil.LimitListener(ln, l.MaxConns)
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
		client := ClientPrefix(ap.Addr())
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
