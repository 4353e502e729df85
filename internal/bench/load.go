// Package bench is the load harness behind `make bench` (cmd/retrysafe-bench): it starts a bare gin + gorm
// ticket insert (the baseline) and the real retrysafe services as processes on fresh databases, drives them from
// this process over loopback, samples the services' memory, and prints a table and draws a chart of what it
// measured. It mirrors ../shared/bench (compare.sh), the project's official figure, so that a clean clone can
// measure itself.
package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Key returns a fresh random Idempotency-Key (32 hex characters).
func Key() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Request is one request a load sends.
type Request struct {
	Method, URL, Key string
	Body             []byte
}

// Sample is what one request took and got. Status 0 is a transport error.
type Sample struct {
	Latency time.Duration
	Status  int
}

// Result is one measurement: a target under one mode of load.
type Result struct {
	Target, Mode string
	Requests     int
	Seconds      float64
	RPS          float64
	P50, P99     time.Duration
	Max          time.Duration
	// Statuses counts answers by HTTP status ("201"), transport errors as "error".
	Statuses map[string]int
	// Rows is what the target's table holds for this mode's effect (storm: the rows the one key left); -1 when
	// not counted.
	Rows int64
	// RSS is the largest resident memory of the target's retrysafe process sampled during this mode (0: not
	// sampled, as for the baseline).
	RSS int64
}

// Summarize turns samples taken over elapsed into a Result.
func Summarize(target, mode string, samples []Sample, elapsed time.Duration) Result {
	r := Result{Target: target, Mode: mode, Requests: len(samples), Seconds: elapsed.Seconds(),
		Statuses: map[string]int{}, Rows: -1}
	if elapsed > 0 {
		r.RPS = float64(len(samples)) / elapsed.Seconds()
	}
	lats := make([]time.Duration, 0, len(samples))
	for _, s := range samples {
		if s.Status == 0 {
			r.Statuses["error"]++
			continue
		}
		r.Statuses[fmt.Sprint(s.Status)]++
		lats = append(lats, s.Latency)
	}
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r.P50, r.P99, r.Max = Percentile(lats, 0.50), Percentile(lats, 0.99), Percentile(lats, 1)
	return r
}

// Percentile is the nearest-rank percentile p (0..1) of sorted latencies, the same rule as the shared loadgen:
// the element at index p*(n-1), rounded down. Zero for no latencies.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(p*float64(len(sorted)-1))]
}

// Client sends requests with a bearer secret; one per target and mode, sized for its concurrency.
type Client struct {
	HTTP   *http.Client
	Secret string
}

// NewClient returns a client keeping up to conns idle connections to one host.
func NewClient(secret string, conns int) *Client {
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute}
	return &Client{HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}, Secret: secret}
}

// Close drops the client's idle connections.
func (c *Client) Close() { c.HTTP.CloseIdleConnections() }

// Send sends one request and returns its sample and, when keep is set, the body.
func (c *Client) Send(ctx context.Context, r Request, keep bool) (Sample, []byte) {
	req, err := http.NewRequestWithContext(ctx, r.Method, r.URL, bytes.NewReader(r.Body))
	if err != nil {
		return Sample{}, nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Secret)
	if r.Key != "" {
		req.Header.Set("Idempotency-Key", r.Key)
	}
	t0 := time.Now()
	res, err := c.HTTP.Do(req)
	if err != nil {
		return Sample{Latency: time.Since(t0)}, nil
	}
	var body []byte
	if keep {
		body, _ = io.ReadAll(res.Body)
	} else {
		_, _ = io.Copy(io.Discard, res.Body)
	}
	res.Body.Close()
	return Sample{Latency: time.Since(t0), Status: res.StatusCode}, body
}

// Load is a closed-loop load: Clients workers send requests back to back for Duration.
type Load struct {
	Clients  int
	Duration time.Duration
	// Next returns the n-th request (n counts from 0 over all workers); ok false stops the worker that asked.
	Next func(n int64) (r Request, ok bool)
	// Answer, when set, receives every answer's status and body (called concurrently).
	Answer func(r Request, status int, body []byte)
}

// Run drives the load and returns its samples and how long it ran.
func (l Load) Run(ctx context.Context, c *Client) ([]Sample, time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, l.Duration)
	defer cancel()
	var (
		n   atomic.Int64
		mu  sync.Mutex
		all []Sample
		wg  sync.WaitGroup
	)
	t0 := time.Now()
	for w := 0; w < l.Clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []Sample
			for ctx.Err() == nil {
				r, ok := l.Next(n.Add(1) - 1)
				if !ok {
					break
				}
				// A request cut by the end of the run is not counted: it was not answered in the window.
				s, body := c.Send(context.WithoutCancel(ctx), r, l.Answer != nil)
				if l.Answer != nil {
					l.Answer(r, s.Status, body)
				}
				local = append(local, s)
			}
			mu.Lock()
			all = append(all, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, time.Since(t0)
}

// Storm fires n copies of one request at once, each on its own connection, and returns the samples and the time
// until the last answer.
func Storm(ctx context.Context, c *Client, r Request, n int) ([]Sample, time.Duration) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		all   = make([]Sample, 0, n)
		start = make(chan struct{})
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			s, _ := c.Send(ctx, r, false)
			mu.Lock()
			all = append(all, s)
			mu.Unlock()
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return all, time.Since(t0)
}
