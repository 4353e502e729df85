// Package faultproxy is a TCP proxy for fault tests: services under test reach PostgreSQL through it, and the
// test cuts, refuses or stalls their connections as a database restart, a crash or a frozen server would,
// without touching the database itself (other tests share it).
//
//	p := faultproxy.Start(t, "127.0.0.1:5432")
//	db := open(p.DSN(testdb.URL()))   // the service's pool goes through the proxy
//	p.CutAll()                        // every open connection drops, as in a fast restart
//	p.Refuse(true)                    // new connections are refused until Refuse(false)
//	p.Stall(true)                     // bytes stop flowing both ways, as with a SIGSTOPped server
package faultproxy

import (
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections to one upstream address.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	conns   map[*pipe]struct{}
	refuse  bool
	stalled bool
	resume  chan struct{} // closed when a stall ends

	accepted atomic.Int64
	held     atomic.Int64
	wg       sync.WaitGroup
}

// pipe is one proxied connection: the client's side and the upstream side.
type pipe struct {
	client, upstream net.Conn
}

func (p *pipe) close() {
	p.client.Close()
	p.upstream.Close()
}

// Start listens on a free local port and forwards to target until the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[*pipe]struct{}{}, resume: make(chan struct{})}
	close(p.resume)
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DSN returns dsn (a postgres:// URL) with its host and port replaced by the proxy's.
func (p *Proxy) DSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic("faultproxy: " + err.Error())
	}
	u.Host = p.Addr()
	return u.String()
}

// Held is how many chunks of bytes the proxy has received and holds back because it is stalled: a test learns
// from it that a statement (a COMMIT) has left the client.
func (p *Proxy) Held() int64 { return p.held.Load() }

// Accepted is how many connections the proxy has accepted, refused ones included.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Open is how many proxied connections are open now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// CutAll closes every open connection at once, both sides, as a crash or an immediate restart of the server
// does. New connections are accepted as before unless Refuse is on.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[*pipe]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Refuse makes the proxy close new connections as soon as it accepts them (on) or forward them again (off).
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Stall stops (on) or resumes (off) the bytes of every connection, open or new, in both directions: the
// connections stay open and nothing arrives, as with a frozen server.
func (p *Proxy) Stall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.stalled {
		return
	}
	p.stalled = on
	if on {
		p.resume = make(chan struct{})
	} else {
		close(p.resume)
	}
}

// Close stops the proxy and drops every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Stall(false)
	p.CutAll()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			client.Close()
			continue
		}
		p.wg.Go(func() { p.serve(client) })
	}
}

func (p *Proxy) serve(client net.Conn) {
	p.waitStall()
	upstream, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	c := &pipe{client: client, upstream: upstream}
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	var both sync.WaitGroup
	both.Go(func() { p.copy(upstream, client) })
	both.Go(func() { p.copy(client, upstream) })
	both.Wait()
	c.close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// copy forwards src to dst chunk by chunk, holding each chunk while the proxy is stalled.
func (p *Proxy) copy(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.held.Add(1)
			p.waitStall()
			p.held.Add(-1)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a cut: closing both sides passes it on
		}
	}
}

func (p *Proxy) waitStall() {
	p.mu.Lock()
	resume := p.resume
	p.mu.Unlock()
	<-resume
}
