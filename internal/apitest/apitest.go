// Package apitest is an HTTP client for tests that checks every response it receives against api/openapi.yaml,
// so the spec cannot drift from what the services answer.
//
//	c := apitest.New(t, srv.URL, "demo-agent-secret")
//	res := c.Post("/v1/tickets", `{"project":"ops","title":"t"}`, apitest.Key("k1"))
//	res.Status(t, 201)
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/retrysafe/retrysafe/api"
)

var (
	specOnce   sync.Once
	specRouter routers.Router
	specErr    error
)

func router() (routers.Router, error) {
	specOnce.Do(func() {
		loader := openapi3.NewLoader()
		doc, err := loader.LoadFromData(api.Spec)
		if err != nil {
			specErr = err
			return
		}
		if err := doc.Validate(loader.Context); err != nil {
			specErr = err
			return
		}
		doc.Servers = nil // match on path only, whatever host the test server listens on
		specRouter, specErr = gorillamux.NewRouter(doc)
	})
	return specRouter, specErr
}

// Client calls one service as one API key.
type Client struct {
	t       testing.TB
	BaseURL string
	Secret  string
	HTTP    *http.Client
}

// New returns a client for the service at baseURL authenticating with secret ("" sends no Authorization).
func New(t testing.TB, baseURL, secret string) *Client {
	t.Helper()
	if _, err := router(); err != nil {
		t.Fatalf("apitest: api/openapi.yaml: %v", err)
	}
	return &Client{t: t, BaseURL: strings.TrimRight(baseURL, "/"), Secret: secret, HTTP: &http.Client{Timeout: 60 * time.Second}}
}

// For returns the client reporting to t instead (a fuzz target's t, for a client made with its f).
func (c *Client) For(t testing.TB) *Client {
	cp := *c
	cp.t = t
	return &cp
}

// As returns a client for the same service with another key.
func (c *Client) As(secret string) *Client {
	cp := *c
	cp.Secret = secret
	return &cp
}

// Option changes a request.
type Option func(*http.Request)

// Key sets Idempotency-Key.
func Key(k string) Option { return Header("Idempotency-Key", k) }

// Header sets a header.
func Header(name, value string) Option { return func(r *http.Request) { r.Header.Set(name, value) } }

// Response is a received and validated response.
type Response struct {
	Code   int
	Header http.Header
	Body   []byte
}

// Get sends a GET.
func (c *Client) Get(path string, opts ...Option) *Response {
	return c.Do(http.MethodGet, path, "", opts...)
}

// Post sends a POST with a JSON body (a string is sent as is, anything else is marshalled).
func (c *Client) Post(path string, body any, opts ...Option) *Response {
	return c.Do(http.MethodPost, path, body, opts...)
}

// Put sends a PUT.
func (c *Client) Put(path string, body any, opts ...Option) *Response {
	return c.Do(http.MethodPut, path, body, opts...)
}

// Do sends a request and validates the response against the spec; a response the spec does not describe fails
// the test. It is safe for concurrent use; failures are reported with t.Errorf.
func (c *Client) Do(method, path string, body any, opts ...Option) *Response {
	c.t.Helper()
	res, err := c.Try(method, path, body, opts...)
	if err != nil {
		c.t.Errorf("apitest: %s %s: %v", method, path, err)
		return &Response{Header: http.Header{}}
	}
	return res
}

// Try is Do that returns transport errors instead of failing the test (for tests that kill the server).
func (c *Client) Try(method, path string, body any, opts ...Option) (*Response, error) {
	c.t.Helper()
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(context.Background(), method, c.BaseURL+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Secret != "" {
		req.Header.Set("Authorization", "Bearer "+c.Secret)
	}
	for _, o := range opts {
		o(req)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	res := &Response{Code: resp.StatusCode, Header: resp.Header, Body: data}
	if err := Validate(req, res); err != nil {
		c.t.Errorf("apitest: %s %s -> %d does not match api/openapi.yaml: %v\nbody: %s", method, path, res.Code, err, data)
	}
	return res, nil
}

// Validate checks a response to req against the spec, and that a JSON answer says Content-Type:
// application/json exactly (no charset parameter), as every retrysafe answer does.
func Validate(req *http.Request, res *Response) error {
	r, err := router()
	if err != nil {
		return err
	}
	if ct := res.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") && ct != "application/json" {
		return fmt.Errorf("Content-Type %q, want application/json", ct)
	}
	route, params, err := r.FindRoute(req)
	if err != nil {
		return err
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status: res.Code,
		Header: res.Header,
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true,
			AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
		},
	}
	in.SetBodyBytes(res.Body)
	return openapi3filter.ValidateResponse(context.Background(), in)
}

// Status fails the test unless the response has status want.
func (r *Response) Status(t testing.TB, want int) *Response {
	t.Helper()
	if r.Code != want {
		t.Fatalf("status %d, want %d; body: %s", r.Code, want, r.Body)
	}
	return r
}

// JSON decodes the body into a map.
func (r *Response) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

// Decode decodes the body into v.
func (r *Response) Decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode body: %v: %s", err, r.Body)
	}
}

// Str returns a string member of the JSON body ("" if absent).
func (r *Response) Str(t testing.TB, name string) string {
	t.Helper()
	s, _ := r.JSON(t)[name].(string)
	return s
}

// Transport is an http.RoundTripper that validates every response it carries against the spec, for tests that
// talk through another client (the provider client that payments uses). A transport error passes through.
func Transport(t testing.TB, next http.RoundTripper) http.RoundTripper {
	if _, err := router(); err != nil {
		t.Fatalf("apitest: api/openapi.yaml: %v", err)
	}
	return roundTripper{t: t, next: next}
}

type roundTripper struct {
	t    testing.TB
	next http.RoundTripper
}

func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(data))
	if err := Validate(req, &Response{Code: resp.StatusCode, Header: resp.Header, Body: data}); err != nil {
		rt.t.Errorf("apitest: %s %s -> %d does not match api/openapi.yaml: %v\nbody: %s", req.Method, req.URL.Path, resp.StatusCode, err, data)
	}
	return resp, nil
}

// HTTPClient is an http.Client whose every response is validated against the spec (see Transport).
func HTTPClient(t testing.TB, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: Transport(t, http.DefaultTransport.(*http.Transport).Clone())}
}
