package apitest

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Copies sends several copies of each of a set of requests at once, spread over clients of replicas of one
// service, the way an agent's duplicates and retries reach a load balancer: copy i of request k goes through
// Clients[(k+i)%len(Clients)].
//
//	answers := apitest.Copies{Clients: clients, Requests: 50, Copies: 6,
//		Send: func(c *apitest.Client, k int) (*apitest.Response, error) {
//			return c.Try(http.MethodPost, "/v1/tickets", body(k), apitest.Key(fmt.Sprint("key-", k)))
//		}}.Run()
//	apitest.AgreeOnce(t, answers, http.StatusCreated)
type Copies struct {
	Clients          []*Client
	Requests, Copies int
	// Send makes request k through c; every copy of k must be the same request under the same key.
	Send func(c *Client, k int) (*Response, error)
	// Again, when set, says whether a copy's answer is one an agent sends again with the same key (409
	// request_in_progress, say). The copy is sent again, through the same client, after the answer's
	// Retry-After (at most MaxWait, 1 s when zero; 100 ms without the header), until Again says no or Deadline
	// (60 s when zero) has passed since Run began; its last answer is kept.
	Again    func(*Response) bool
	MaxWait  time.Duration
	Deadline time.Duration
}

// Answer is the last answer one copy got, or the transport error that ended it, and how many times the copy
// was sent.
type Answer struct {
	Res   *Response
	Err   error
	Sends int
}

// Replayed tells whether the answer is a stored one sent again (Idempotent-Replayed: true).
func (a Answer) Replayed() bool {
	return a.Res != nil && a.Res.Header.Get("Idempotent-Replayed") == "true"
}

// Run sends every copy of every request at once (behind one start barrier) and returns answers[k][i], the
// answer of copy i of request k.
func (cs Copies) Run() [][]Answer {
	maxWait, deadline := cs.MaxWait, cs.Deadline
	if maxWait <= 0 {
		maxWait = time.Second
	}
	if deadline <= 0 {
		deadline = time.Minute
	}
	end := time.Now().Add(deadline)
	answers := make([][]Answer, cs.Requests)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range answers {
		answers[k] = make([]Answer, cs.Copies)
		for i := range cs.Copies {
			c := cs.Clients[(k+i)%len(cs.Clients)]
			wg.Go(func() {
				<-start
				a := &answers[k][i]
				for {
					a.Sends++
					a.Res, a.Err = cs.Send(c, k)
					if a.Err != nil || cs.Again == nil || !cs.Again(a.Res) || time.Now().After(end) {
						return
					}
					time.Sleep(retryAfter(a.Res, maxWait))
				}
			})
		}
	}
	close(start)
	wg.Wait()
	return answers
}

// retryAfter is the wait an answer asks for, at most maxWait; 100 ms when it names none.
func retryAfter(res *Response, maxWait time.Duration) time.Duration {
	secs, err := strconv.Atoi(res.Header.Get("Retry-After"))
	if err != nil || secs <= 0 {
		return min(100*time.Millisecond, maxWait)
	}
	return min(time.Duration(secs)*time.Second, maxWait)
}

// AgreeOnce fails the test unless every copy of each request ended with status want and the same body, byte
// for byte, and exactly one copy of each request got the fresh answer, the others its replay.
func AgreeOnce(t testing.TB, answers [][]Answer, want int) {
	t.Helper()
	for k, as := range answers {
		fresh := 0
		for i, a := range as {
			if a.Err != nil || a.Res.Code != want {
				var got []byte
				code := 0
				if a.Res != nil {
					code, got = a.Res.Code, a.Res.Body
				}
				t.Fatalf("request %d copy %d (sent %d times): %d %v %s; want %d", k, i, a.Sends, code, a.Err, got, want)
			}
			if !bytes.Equal(a.Res.Body, as[0].Res.Body) {
				t.Fatalf("request %d: copies answered differently:\n%s\n%s", k, as[0].Res.Body, a.Res.Body)
			}
			if !a.Replayed() {
				fresh++
			}
		}
		if fresh != 1 {
			t.Errorf("request %d: %d answers were not replays; want exactly 1", k, fresh)
		}
	}
}

// SentAgain counts the copies that were sent more than once.
func SentAgain(answers [][]Answer) int {
	n := 0
	for _, as := range answers {
		for _, a := range as {
			if a.Sends > 1 {
				n++
			}
		}
	}
	return n
}

// AgainOn is a Copies.Again that sends a copy again when its answer is a problem with one of codes (such as
// request_in_progress, environment_locked or store_unavailable: answers that tell the caller to retry with
// the same key).
func AgainOn(codes ...string) func(*Response) bool {
	return func(r *Response) bool {
		var p struct{ Code string }
		if r.Code < 400 || json.Unmarshal(r.Body, &p) != nil {
			return false
		}
		return slices.Contains(codes, p.Code)
	}
}
