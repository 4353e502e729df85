package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// Client calls the provider for one merchant. Its errors say what the caller
// may conclude:
//
//   - nil: the call executed (or was replayed) and this is its answer;
//   - an error that errors.As finds an *Error in and that is not
//     ErrOutcomeUnknown: the provider refused the call (4xx), nothing executed;
//   - errors.Is(err, ErrOutcomeUnknown): the call may or may not have executed.
//     Retry with the same idempotency key, or ask Lookup. A 5xx also carries
//     its *Error;
//   - errors.Is(err, ErrNotSent): the call never left this process (no
//     connection was established): nothing executed.
//
// With WithDispatchObserver, every keyed call is also reported as a Dispatch.
//
// A Client is safe for concurrent use.
type Client struct {
	baseURL string
	secret  string
	http    *http.Client
	observe func(outcome string, d time.Duration)
}

// NewClient returns a client of the provider at baseURL (such as
// "http://127.0.0.1:8090") for the merchant holding secret. timeout bounds
// each call, connection to last byte; a call cut by it has ErrOutcomeUnknown.
func NewClient(baseURL, secret string, timeout time.Duration) *Client {
	return NewClientHTTP(baseURL, secret, &http.Client{Timeout: timeout})
}

// NewClientHTTP is NewClient with the caller's http.Client (its Timeout bounds each call); tests use it to check
// every answer against api/openapi.yaml on the way.
func NewClientHTTP(baseURL, secret string, hc *http.Client) *Client {
	return &Client{baseURL: strings.TrimRight(baseURL, "/"), secret: secret, http: hc}
}

// WithObserver returns a copy of c that reports every call to observe (metrics): its duration, connection to
// last byte, and its outcome: "ok" (2xx), "refused" (a 4xx: nothing executed; for Lookup a 404 means no call
// under the key) or "unknown" (no answer, a 5xx or an unreadable one: the call may have executed).
func (c *Client) WithObserver(observe func(outcome string, d time.Duration)) *Client {
	cp := *c
	cp.observe = observe
	return &cp
}

// Authorize places a hold of req.AmountMinor on the card.
func (c *Client) Authorize(ctx context.Context, key string, req AuthorizeRequest) (Authorization, error) {
	var a Authorization
	err := c.do(ctx, http.MethodPost, "/v1/authorizations", key, req, &a)
	return a, err
}

// Capture captures amountMinor of the authorization; the rest is released.
// Refusals: 404 not_found, 409 already_captured or invalid_state (voided),
// 422 amount_too_large.
func (c *Client) Capture(ctx context.Context, key, authID string, amountMinor int64) (Capture, error) {
	var cp Capture
	err := c.do(ctx, http.MethodPost, "/v1/authorizations/"+url.PathEscape(authID)+"/capture", key,
		amountRequest{AmountMinor: amountMinor}, &cp)
	return cp, err
}

// Void releases an authorization that was not captured.
// Refusals: 404 not_found, 409 invalid_state.
func (c *Client) Void(ctx context.Context, key, authID string) (Authorization, error) {
	var a Authorization
	err := c.do(ctx, http.MethodPost, "/v1/authorizations/"+url.PathEscape(authID)+"/void", key, struct{}{}, &a)
	return a, err
}

// Refund returns amountMinor of the captured money.
// Refusals: 404 not_found, 409 invalid_state (not captured),
// 422 amount_too_large (more than captured and not yet refunded).
func (c *Client) Refund(ctx context.Context, key, authID string, amountMinor int64) (Refund, error) {
	var rf Refund
	err := c.do(ctx, http.MethodPost, "/v1/authorizations/"+url.PathEscape(authID)+"/refunds", key,
		amountRequest{AmountMinor: amountMinor}, &rf)
	return rf, err
}

// GetAuthorization reads an authorization. Refusal: 404 not_found.
func (c *Client) GetAuthorization(ctx context.Context, authID string) (Authorization, error) {
	var a Authorization
	err := c.do(ctx, http.MethodGet, "/v1/authorizations/"+url.PathEscape(authID), "", nil, &a)
	return a, err
}

// Lookup asks what the provider answered to the call made with key. Found is
// false when the provider never executed a call with it: a retry with the
// key executes the call for the first time. A call still running is an
// *Error with Code "request_in_progress".
func (c *Client) Lookup(ctx context.Context, key string) (LookupResult, error) {
	var res LookupResult
	err := c.do(ctx, http.MethodGet, "/v1/idempotency/"+url.PathEscape(key), "", nil, &res)
	if pe, ok := errors.AsType[*Error](err); ok && pe.Status == http.StatusNotFound && pe.Code == CodeNotFound {
		return LookupResult{}, nil
	}
	if err != nil {
		return LookupResult{}, err
	}
	res.Found = true
	return res, nil
}

// Answer reads the stored answer of a found lookup the way the original call
// would have: a 2xx is decoded into out and gives nil, a 4xx is the *Error of
// the refusal. A lookup that found nothing has no answer: ErrOutcomeUnknown.
func (r LookupResult) Answer(out any) error {
	switch {
	case !r.Found:
		return fmt.Errorf("provider: no stored answer for key %q: %w", r.Key, ErrOutcomeUnknown)
	case r.Status >= 200 && r.Status < 300:
		if err := json.Unmarshal(r.Body, out); err != nil {
			return fmt.Errorf("provider: decoding the stored %d answer of key %q: %w: %w", r.Status, r.Key, ErrOutcomeUnknown, err)
		}
		return nil
	case r.Status >= 400 && r.Status < 500:
		return decodeError(r.Status, r.Body)
	default:
		return fmt.Errorf("provider: stored answer %d of key %q: %w: %w", r.Status, r.Key, ErrOutcomeUnknown, decodeError(r.Status, r.Body))
	}
}

// Effects lists the calls executed with a success since the time given (all of them for the zero time), oldest
// first, each with its authorization as it stands now.
func (c *Client) Effects(ctx context.Context, since time.Time) ([]Effect, error) {
	path := "/v1/effects"
	if !since.IsZero() {
		path += "?since=" + url.QueryEscape(since.UTC().Format(time.RFC3339Nano))
	}
	var out struct {
		Effects []Effect `json:"effects"`
	}
	err := c.do(ctx, http.MethodGet, path, "", nil, &out)
	return out.Effects, err
}

// Counters returns how many times each kind of call executed for this
// merchant ("authorize", "capture", "void", "refund"); replays do not count.
func (c *Client) Counters(ctx context.Context) (map[string]int64, error) {
	var counters map[string]int64
	err := c.do(ctx, http.MethodGet, "/admin/counters", "", nil, &counters)
	return counters, err
}

// InjectFault arms f for this merchant. It is a 404 *Error unless the
// provider runs with Config.FaultInjection.
func (c *Client) InjectFault(ctx context.Context, f Fault) error {
	return c.do(ctx, http.MethodPost, "/admin/faults", "", f, nil)
}

// ClearFaults disarms every fault of this merchant.
func (c *Client) ClearFaults(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/admin/faults", "", nil, nil)
}

// Reset forgets this merchant's authorizations, keys, counters and faults.
func (c *Client) Reset(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/admin/reset", "", nil, nil)
}

// do sends one call with in as its JSON body (none when nil) and decodes a 2xx
// answer into out (ignored when nil). A keyed call is reported to the
// context's DispatchObserver, if any, before it is written and once it ends.
func (c *Client) do(ctx context.Context, method, path, key string, in, out any) error {
	if c.observe == nil {
		return c.send(ctx, method, path, key, in, out)
	}
	start := time.Now()
	err := c.send(ctx, method, path, key, in, out)
	outcome := "ok"
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
		outcome = "unknown"
	case err != nil:
		outcome = "refused"
	}
	c.observe(outcome, time.Since(start))
	return err
}

// send makes one call. A keyed call is reported to the context's DispatchObserver, if any: before it is
// written, and with how it ended.
func (c *Client) send(ctx context.Context, method, path, key string, in, out any) error {
	obs := observerFrom(ctx)
	if key == "" {
		obs = nil
	}
	d, err := c.dispatch(ctx, obs, Dispatch{Method: method, Path: path, Key: key}, in, out)
	if obs != nil {
		obs.Finished(ctx, d)
	}
	return err
}

// dispatch builds the call d, has obs (if not nil) record that it starts, sends it and reads the answer into
// out. It returns the dispatch as it ended (not sent, sent without an answer, or answered) and the call's error.
func (c *Client) dispatch(ctx context.Context, obs DispatchObserver, d Dispatch, in, out any) (Dispatch, error) {
	// The connection trace tells "never connected" (nothing left: not sent) from "connected" (the request may
	// have reached the provider), which a transport error alone does not.
	var connected atomic.Bool
	traced := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	req, err := c.newRequest(traced, d, in)
	if err != nil {
		d.State, d.Reason = DispatchExecutionError, ReasonRequestNotBuilt
		return d, err
	}
	if obs != nil {
		if err := obs.Started(ctx, d); err != nil {
			// Without the record of the dispatch, the call is not made: a later reader could not tell it left.
			d.State, d.Reason = DispatchNotSent, ReasonEvidenceNotRecorded
			return d, fmt.Errorf("provider: %s %s: %w: %w", d.Method, d.Path, ErrNotSent, err)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if !connected.Load() {
			d.State, d.Reason = DispatchNotSent, notSentReason(err)
			return d, fmt.Errorf("provider: %s %s: %w: %w", d.Method, d.Path, ErrNotSent, err)
		}
		d.State, d.Reason = DispatchSentNoResponse, sentReason(err)
		return d, fmt.Errorf("provider: %s %s: %w: %w", d.Method, d.Path, ErrOutcomeUnknown, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes))
	if err != nil {
		d.State, d.Reason, d.Status = DispatchSentNoResponse, ReasonResponseCut, resp.StatusCode
		return d, fmt.Errorf("provider: %s %s: reading the answer: %w: %w", d.Method, d.Path, ErrOutcomeUnknown, err)
	}
	d = received(d, resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", b)
	return decodeAnswer(d, b, out)
}

// newRequest builds the request of d with in as its JSON body (none when nil). Its errors match ErrNotSent.
func (c *Client) newRequest(ctx context.Context, d Dispatch, in any) (*http.Request, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("provider: encoding %s %s: %w: %w", d.Method, d.Path, ErrNotSent, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, d.Method, c.baseURL+d.Path, body)
	if err != nil {
		return nil, fmt.Errorf("provider: %s %s: %w: %w", d.Method, d.Path, ErrNotSent, err)
	}
	// Without GetBody, net/http never resends the request by itself (it would
	// for a request with an Idempotency-Key on a reused connection): a lost
	// answer reaches the caller as ErrOutcomeUnknown and the caller decides.
	req.GetBody = nil
	req.Header.Set("Authorization", "Bearer "+c.secret)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if d.Key != "" {
		req.Header.Set("Idempotency-Key", d.Key)
	}
	return req, nil
}

// decodeAnswer decodes the body of a 2xx answer into out (ignored when nil) and turns any other answer into
// the call's error: a 4xx is the provider's refusal, anything else leaves the outcome unknown.
func decodeAnswer(d Dispatch, body []byte, out any) (Dispatch, error) {
	switch {
	case d.Status >= 200 && d.Status < 300:
		if out == nil || d.Status == http.StatusNoContent {
			return d, nil
		}
		if err := json.Unmarshal(body, out); err != nil {
			// It executed, but we cannot tell the caller what it did.
			d.Reason = ReasonResponseNotUnderstood
			return d, fmt.Errorf("provider: %s %s: decoding the %d answer: %w: %w", d.Method, d.Path, d.Status, ErrOutcomeUnknown, err)
		}
		return d, nil
	case d.Status >= 400 && d.Status < 500:
		return d, decodeError(d.Status, body)
	default:
		// 5xx, or a status this client does not expect: the call may have run.
		return d, fmt.Errorf("provider: %s %s: %w: %w", d.Method, d.Path, ErrOutcomeUnknown, decodeError(d.Status, body))
	}
}

// decodeError reads a problem document; a body that is not one still gives an
// *Error with the status and the body's start as detail.
func decodeError(status int, body []byte) *Error {
	var p problem
	if err := json.Unmarshal(body, &p); err != nil || p.Code == "" {
		detail := string(body)
		if len(detail) > 200 {
			detail = detail[:200]
		}
		return &Error{Status: status, Detail: detail}
	}
	return &Error{Status: status, Code: p.Code, Detail: p.Detail}
}
