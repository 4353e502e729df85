package httpserver

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/poll"
)

// serveLimited serves h (nil: a handler that answers 200) on a loopback listener under l, every peer counted by
// the per-client cap (exempt nothing), and returns its address.
func serveLimited(t *testing.T, l Limits, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l = l.withDefaults()
	if h == nil {
		h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})
	}
	srv := newServer(h, slog.New(slog.DiscardHandler), l)
	limited := limitListener(ln, l, func(netip.Addr) bool { return false })
	srv.ConnState = limited.connState
	go srv.Serve(limited)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// client is one raw keep-alive connection to the server.
type client struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A watchdog, not a timing assertion: a test that would hang fails instead.
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &client{Conn: c, r: bufio.NewReader(c)}
}

// get sends a GET / and returns the answer's status, or the error reading it.
func (c *client) get() (int, error) { return c.getPath("/") }

func (c *client) getPath(path string) (int, error) {
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return 0, err
	}
	res, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// TestConnectionsPerClientAreCapped: a client holding MaxConnsPerClient connections has its next one closed
// unanswered; once one of its connections closes, it may open another.
func TestConnectionsPerClientAreCapped(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, Limits{MaxConnsPerClient: 2}, nil)
	first, second := dial(t, addr), dial(t, addr)
	for i, c := range []*client{first, second} {
		if status, err := c.get(); err != nil || status != http.StatusOK {
			t.Fatalf("connection %d: %d %v", i+1, status, err)
		}
	}
	if status, err := dial(t, addr).get(); err == nil {
		t.Fatalf("a third connection of one client was answered %d", status)
	}
	first.Close()
	// The server sees the close when it next reads that connection: poll until the place is free.
	poll.Until(t, "a connection accepted after one of the client's two closed", func() bool {
		status, err := dial(t, addr).get()
		return err == nil && status == http.StatusOK
	})
	if status, err := second.get(); err != nil || status != http.StatusOK {
		t.Fatalf("the client's open connection: %d %v", status, err)
	}
}

// TestConnectionsAreCapped: with MaxConns connections in a request, the next connection is not served until
// one of them is done; it then takes the place of the connection idle longest.
func TestConnectionsAreCapped(t *testing.T) {
	t.Parallel()
	finish := make(chan struct{})
	addr := serveLimited(t, Limits{MaxConns: 2}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-finish
		}
	}))
	first, second := dial(t, addr), dial(t, addr)
	for _, c := range []*client{first, second} {
		if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	third := dial(t, addr)
	if _, err := io.WriteString(third, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := third.r.Peek(1); err == nil {
		t.Fatal("a third connection was served while two were in a request")
	}
	third.SetDeadline(time.Now().Add(20 * time.Second))
	close(finish)
	for _, c := range []*client{first, second} {
		if res, err := http.ReadResponse(c.r, nil); err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("a slow request: %v %v", res, err)
		}
	}
	res, err := http.ReadResponse(third.r, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("after the requests were done, the waiting connection: %v %v", res, err)
	}
	open := 0
	for _, c := range []*client{first, second} {
		if status, err := c.get(); err == nil && status == http.StatusOK {
			open++
		}
	}
	if open != 1 {
		t.Fatalf("%d of the two first connections still served; want one, the other closed for the third", open)
	}
}

// TestIdleConnectionsGiveWay: MaxConns keep-alive connections that each asked GET /healthz and then sit idle do
// not keep a real request waiting for the idle timeout (an hour here; the client gives up long before): the new
// connection takes the place of the one idle longest, and the others stay open.
func TestIdleConnectionsGiveWay(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ServeListener(ctx, ln, NewRouter(Options{Logger: slog.New(slog.DiscardHandler)}), slog.New(slog.DiscardHandler),
			Limits{MaxConns: 3, IdleTimeout: time.Hour})
	}()
	t.Cleanup(func() { cancel(); <-done })
	addr := ln.Addr().String()
	var idle []*client
	for range 3 {
		c := dial(t, addr)
		if status, err := c.getPath("/healthz"); err != nil || status != http.StatusOK {
			t.Fatalf("GET /healthz: %d %v", status, err)
		}
		idle = append(idle, c)
	}

	real := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := real.Get("http://" + addr + "/healthz")
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("a request while three idle connections held every place: %v %v", res, err)
	}
	res.Body.Close()

	open := 0
	for _, c := range idle {
		if status, err := c.getPath("/healthz"); err == nil && status == http.StatusOK {
			open++
		}
	}
	if open != 2 {
		t.Errorf("%d of the three idle connections still open; want 2 (one closed to make room)", open)
	}
}

func TestServerTimeouts(t *testing.T) {
	t.Parallel()
	srv := newServer(http.NotFoundHandler(), slog.New(slog.DiscardHandler), Limits{}.withDefaults())
	if srv.IdleTimeout != DefaultIdleTimeout || srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 {
		t.Fatalf("timeouts: idle %s, header %s, read %s, write %s", srv.IdleTimeout, srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout)
	}
	if DefaultIdleTimeout > 30*time.Second {
		t.Fatalf("idle keep-alives live %s", DefaultIdleTimeout)
	}
}

func TestExemptPeer(t *testing.T) {
	t.Parallel()
	exempt := exemptPeer([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	for addr, want := range map[string]bool{"127.0.0.1": true, "::1": true, "10.1.2.3": true, "192.0.2.7": false} {
		if exempt(netip.MustParseAddr(addr)) != want {
			t.Errorf("exempt(%s) = %v", addr, !want)
		}
	}
}
