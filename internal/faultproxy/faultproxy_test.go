package faultproxy_test

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/faultproxy"
	"github.com/retrysafe/retrysafe/internal/poll"
)

// echo serves a line-echo upstream for the proxy to forward to.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string) (string, error) {
	t.Helper()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func TestForwardCutRefuseStall(t *testing.T) {
	t.Parallel()
	p := faultproxy.Start(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(t, c, r, "hello"); err != nil || got != "hello\n" {
		t.Fatalf("forwarded = %q, %v", got, err)
	}

	p.Stall(true)
	c.SetDeadline(time.Now().Add(2 * time.Second))
	c.Write([]byte("held\n"))
	poll.Until(t, "the proxy holds the bytes", func() bool { return p.Held() > 0 })
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("an answer came through a stalled proxy")
	}
	p.Stall(false)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("after the stall = %q, %v; want the held bytes delivered", got, err)
	}

	p.CutAll()
	if _, err := roundTrip(t, c, r, "after cut"); err == nil {
		t.Fatal("a cut connection still answers")
	}

	p.Refuse(true)
	refused, err := net.Dial("tcp", p.Addr())
	if err == nil {
		refused.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := refused.Read(make([]byte, 1)); err == nil {
			t.Fatal("a refused connection was served")
		}
		refused.Close()
	}
	p.Refuse(false)
	again, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if got, err := roundTrip(t, again, bufio.NewReader(again), "back"); err != nil || got != "back\n" {
		t.Fatalf("after the outage = %q, %v", got, err)
	}
}
