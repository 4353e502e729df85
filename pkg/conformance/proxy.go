package conformance

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// dropProxy forwards each request to the target, reads the target's whole answer (so the target has finished),
// records it, and closes the caller's connection without sending a byte of it: the answer is lost after the
// work was done, the fault retries exist for.
type dropProxy struct {
	URL     *url.URL
	srv     *http.Server
	ln      net.Listener
	dropped chan response
}

func (r *runner) startDropProxy() (*dropProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &dropProxy{ln: ln, dropped: make(chan response, 1)}
	p.URL = &url.URL{Scheme: "http", Host: ln.Addr().String(), Path: r.target.Path}
	r.allow(ln.Addr().String())
	upstream := r.newClient(true)
	p.srv = &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, in *http.Request) {
			a := r.forward(in, upstream)
			select {
			case p.dropped <- a:
			default: // only the first request of a case is recorded; the case sends one
			}
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		}),
	}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// forward sends in to the target, as it came, and reads the whole answer.
func (r *runner) forward(in *http.Request, client *http.Client) response {
	start := time.Now()
	body, err := io.ReadAll(io.LimitReader(in.Body, 4<<20))
	if err != nil {
		return response{err: err}
	}
	u := *r.target
	u.Path, u.RawPath = in.URL.Path, in.URL.RawPath
	u.RawQuery = in.URL.RawQuery
	out, err := http.NewRequestWithContext(context.WithoutCancel(in.Context()), in.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return response{err: err}
	}
	out.Header = in.Header.Clone()
	out.GetBody = nil // one attempt, never resent by the transport (see send)
	resp, err := client.Do(out)
	if err != nil {
		return response{err: errors.New(r.mask(shortError(err))), elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return response{err: errors.New(r.mask(shortError(err))), elapsed: time.Since(start)}
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data, elapsed: time.Since(start)}
}

// lastDropped returns the answer the proxy dropped, waiting at most timeout for it.
func (p *dropProxy) lastDropped(timeout time.Duration) (response, bool) {
	select {
	case a := <-p.dropped:
		return a, true
	case <-time.After(timeout):
		return response{}, false
	}
}

func (p *dropProxy) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
	_ = p.srv.Close()
}
