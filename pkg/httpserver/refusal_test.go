package httpserver_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
)

// TestUnauthenticatedBodyIsNotRead: a POST without a known key that announces a 100,000-byte body and sends
// 4 bytes gets its 401 at once, with Connection: close, and the server closes the connection without waiting
// for the rest: the client holds nothing. The handler behind authentication never runs.
func TestUnauthenticatedBodyIsNotRead(t *testing.T) {
	t.Parallel()
	r := httpserver.NewRouter(httpserver.Options{Logger: slog.New(slog.DiscardHandler)})
	reached := make(chan struct{}, 1)
	r.Group("", httpserver.Wrap(auth.Middleware(auth.Demo()))).POST("/v1/things", func(c *gin.Context) { reached <- struct{}{} })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- httpserver.ServeListener(ctx, ln, r, slog.New(slog.DiscardHandler), httpserver.Limits{})
	}()
	t.Cleanup(func() { cancel(); <-done })

	for _, authz := range []string{"", "Authorization: Bearer not-a-key\r\n"} {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// A watchdog below the server's 30 s read timeout, not a timing assertion: a server that drains the
		// body answers only when that timeout ends, and the test fails instead of hanging.
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		fmt.Fprintf(conn, "POST /v1/things HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"a\"", authz)
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%q: no answer before the body was sent: %v", authz, err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || !strings.Contains(string(body), `"code":"unauthorized"`) {
			t.Fatalf("%q: body %s, %v", authz, body, err)
		}
		// res.Close is the answer's Connection: close (ReadResponse takes the header out).
		if res.StatusCode != http.StatusUnauthorized || !res.Close {
			t.Fatalf("%q: %d, close %v; want 401 and Connection: close", authz, res.StatusCode, res.Close)
		}
		if _, err := br.ReadByte(); err == nil {
			rest, _ := io.ReadAll(br)
			t.Fatalf("%q: the server sent more after its 401: %q", authz, rest)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%q: the server kept the connection open after its 401", authz)
		}
	}
	select {
	case <-reached:
		t.Fatal("a request without a known key reached the handler")
	default:
	}
}

// TestAnswersAreNotSniffed: every answer, JSON, problem or health, says X-Content-Type-Options: nosniff, so a
// browser never renders a JSON answer that quotes a caller's text as HTML.
func TestAnswersAreNotSniffed(t *testing.T) {
	t.Parallel()
	r := httpserver.NewRouter(httpserver.Options{Logger: slog.New(slog.DiscardHandler)})
	r.GET("/json", func(c *gin.Context) { httpserver.JSON(c, http.StatusOK, gin.H{"title": "<script>x</script>"}) })
	for _, path := range []string{"/json", "/healthz", "/no-such-route"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
			body, _ := io.ReadAll(rec.Body)
			t.Errorf("GET %s (%d %s): X-Content-Type-Options %q", path, rec.Code, body, got)
		}
	}
}
