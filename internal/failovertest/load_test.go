package failovertest

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/pkg/ids"
)

// kind is what a write does.
type kind string

const (
	kindTicket  kind = "ticket"  // POST /v1/tickets
	kindIntent  kind = "intent"  // POST /v1/payment_intents: an authorization at the provider
	kindCapture kind = "capture" // POST /v1/payment_intents/{id}/capture: a capture at the provider
	kindDeploy  kind = "deploy"  // POST /v1/deploys: an activation at the target
)

var kinds = []kind{kindTicket, kindIntent, kindCapture, kindDeploy}

// external reports whether k's effect leaves the process (the provider's).
func (k kind) external() bool { return k == kindIntent || k == kindCapture }

// attempt is one HTTP attempt of a write, named by its Attempt-Id so that the operation's claim can be matched
// with the answer this attempt got.
type attempt struct {
	id       string
	sent     time.Time
	answered time.Time
	status   int    // 0: no answer (the connection failed or timed out)
	code     string // the problem's code, when the answer is one
	replayed bool
}

func (a attempt) success() bool { return a.status >= 200 && a.status < 300 }

// write is one idempotent request: a key and a body, sent until it gets a definite answer, as an agent does.
type write struct {
	kind kind
	key  string
	body string

	mu       sync.Mutex
	attempts []attempt
	ack      *apitest.Response // the first success
	ackAt    time.Time
	last     *apitest.Response // the last definite answer
	// notSent: the answer is the stored "never reached the provider, nothing happened; send it again with a new
	// Idempotency-Key", and the job went on with a new key.
	notSent bool
}

func (w *write) acked() (*apitest.Response, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ack, w.ackAt
}

// job is one agent task: a ticket, a payment (its intent, then its capture) or a deploy.
type job struct {
	n      int
	writes []*write // every write it made, in order
	// current is, by kind, the write the job sends now: the first, or the one with a new key that replaced a
	// write answered "nothing happened, send it again with a new key".
	current map[kind]*write
}

// driver sends jobs through a stack and keeps every attempt.
type driver struct {
	t    *testing.T
	s    *stack
	name string // names this run's keys, orders and environments

	mu   sync.Mutex
	jobs []*job
	done atomic.Int64
	// agent, when set, made payments of its own beside the jobs' (the provider's counters count them too).
	agent *agentDriver
}

func newDriver(t *testing.T, s *stack, name string) *driver { return &driver{t: t, s: s, name: name} }

// newJob makes job n: a ticket, a payment or a deploy in turn.
func (d *driver) newJob(n int) *job {
	id := fmt.Sprintf("%s-%03d", d.name, n)
	j := &job{n: n}
	switch n % 3 {
	case 0:
		j.writes = []*write{{kind: kindTicket, key: "t-" + id, body: fmt.Sprintf(`{"project":"failover","title":%q}`, id)}}
	case 1:
		j.writes = []*write{
			{kind: kindIntent, key: "pi-" + id, body: fmt.Sprintf(`{"order_id":%q,"amount_minor":%d,"currency":"USD"}`, id, 1000+n)},
			{kind: kindCapture, key: "pc-" + id, body: `{}`},
		}
	default:
		sum := sha1.Sum([]byte(id))
		j.writes = []*write{{kind: kindDeploy, key: "d-" + id,
			body: fmt.Sprintf(`{"service":"web","environment":"fo-%s","commit_sha":%q}`, id, hex.EncodeToString(sum[:]))}}
	}
	j.current = map[kind]*write{}
	for _, w := range j.writes {
		j.current[w.kind] = w
	}
	d.mu.Lock()
	d.jobs = append(d.jobs, j)
	d.mu.Unlock()
	return j
}

// notSent reports whether res is payments' stored answer for a call that never reached the provider: nothing
// happened, and the answer tells the agent to send the request again with a new Idempotency-Key.
func notSent(res *apitest.Response) bool {
	return res != nil && res.Code == http.StatusBadGateway && problemCode(res) == "provider_unavailable"
}

// again is what the agent does with a write answered notSent: the same request under a new key.
func (d *driver) again(j *job, w *write) *write {
	next := &write{kind: w.kind, key: w.key + "-again", body: w.body}
	d.mu.Lock()
	w.notSent = true
	j.writes = append(j.writes, next)
	j.current[w.kind] = next
	d.mu.Unlock()
	return next
}

// run sends j's current writes in order, each until a definite answer, as an agent that follows the answers
// does. A payment write answered notSent is sent again under a new key (again). A capture answered 404 names an
// intent the database lost with the old primary: the intent's create, sent again under its key, makes it anew
// (and its authorization is the provider's first, replayed), and the capture goes to that one under its own key.
func (d *driver) run(j *job) {
	d.mu.Lock()
	first := j.writes[0]
	d.mu.Unlock()
	switch first.kind {
	case kindTicket:
		d.send(j.current[kindTicket], "/v1/tickets")
	case kindDeploy:
		d.send(j.current[kindDeploy], "/v1/deploys")
	case kindIntent:
		for range 4 {
			d.mu.Lock()
			create, capture := j.current[kindIntent], j.current[kindCapture]
			d.mu.Unlock()
			res := d.send(create, "/v1/payment_intents")
			if notSent(res) {
				d.again(j, create)
				continue
			}
			if res == nil || res.Code != http.StatusCreated {
				d.t.Errorf("%s: create answered %v; want 201", create.key, describe(res))
				return
			}
			var in struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(res.Body, &in); err != nil {
				d.t.Errorf("%s: %v", create.key, err)
				return
			}
			res = d.send(capture, "/v1/payment_intents/"+in.ID+"/capture")
			switch {
			case notSent(res):
				d.again(j, capture)
			case res == nil || res.Code != http.StatusNotFound:
				return
			}
		}
		d.t.Errorf("job %d: no payment after four rounds", j.n)
	}
}

// writeBound is how long one write is sent again before the test gives up on it.
const writeBound = 2 * time.Minute

// send posts w's body to path under w's key until the answer is definite: a success, or a refusal other than
// "in progress". 5xx, 202 unknown (payments), 409 request_in_progress and no answer at all are sent again under
// the same key, as the contract tells an agent to.
func (d *driver) send(w *write, path string) *apitest.Response {
	client := map[kind]*apitest.Client{kindTicket: d.s.tickets, kindIntent: d.s.payments, kindCapture: d.s.payments, kindDeploy: d.s.deploys}[w.kind]
	deadline := time.Now().Add(writeBound)
	for {
		w.mu.Lock()
		a := attempt{id: w.key + "." + strconv.Itoa(len(w.attempts)+1), sent: time.Now()}
		w.mu.Unlock()
		res, err := client.Try(http.MethodPost, path, w.body, apitest.Key(w.key), apitest.Header(ids.HeaderAttemptID, a.id))
		a.answered = time.Now()
		if err == nil {
			a.status, a.code, a.replayed = res.Code, problemCode(res), res.Header.Get("Idempotent-Replayed") == "true"
		}
		final := err == nil && definite(w.kind, res)
		w.mu.Lock()
		w.attempts = append(w.attempts, a)
		if final {
			w.last = res
			if a.success() && w.ack == nil {
				w.ack, w.ackAt = res, a.answered
			}
		}
		w.mu.Unlock()
		if final {
			return res
		}
		if time.Now().After(deadline) {
			d.t.Errorf("%s: no definite answer in %s; the last: %v", w.key, writeBound, describe(res))
			return nil
		}
		time.Sleep(pause(res))
	}
}

func definite(k kind, res *apitest.Response) bool {
	switch {
	case res.Header.Get("Idempotent-Replayed") == "true", notSent(res):
		return true // a stored answer, whatever it is
	case res.Code == http.StatusAccepted && k.external():
		return false // the provider's answer is not known yet
	case res.Code >= 200 && res.Code < 300:
		return true
	case res.Code == http.StatusConflict && problemCode(res) == "request_in_progress", res.Code == http.StatusTooManyRequests:
		return false
	}
	return res.Code < 500
}

// pause is the wait before sending again: Retry-After, at most a second, or a fifth of one.
func pause(res *apitest.Response) time.Duration {
	if res != nil {
		if s, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil && s > 0 {
			return min(time.Duration(s)*time.Second, time.Second)
		}
	}
	return 200 * time.Millisecond
}

func problemCode(res *apitest.Response) string {
	if res.Code < 400 {
		return ""
	}
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(res.Body, &p)
	return p.Code
}

func describe(res *apitest.Response) string {
	if res == nil {
		return "no answer"
	}
	return fmt.Sprintf("%d %s", res.Code, res.Body)
}

// load runs jobs on workers goroutines, a job after another, until stop is closed; the returned function
// waits for the jobs in progress to finish.
func (d *driver) load(workers int, stop <-chan struct{}) (wait func()) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d.run(d.newJob(int(next.Add(1))))
				d.done.Add(1)
				// Pacing: load that the failover interrupts, not a saturated machine.
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	return wg.Wait
}

// writes is every write of every job so far.
func (d *driver) writes() []*write {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ws []*write
	for _, j := range d.jobs {
		ws = append(ws, j.writes...)
	}
	return ws
}

// ackedSince counts the writes of kind k first answered with a success after t.
func (d *driver) ackedSince(t time.Time, k kind) int {
	n := 0
	for _, w := range d.writes() {
		if ack, at := w.acked(); w.kind == k && ack != nil && at.After(t) {
			n++
		}
	}
	return n
}

// firstWriteAfter is the first success that executed a write (not a replay) among attempts sent after t.
func (d *driver) firstWriteAfter(t time.Time) (time.Time, bool) {
	var first time.Time
	for _, w := range d.writes() {
		w.mu.Lock()
		for _, a := range w.attempts {
			if a.sent.After(t) && a.success() && !a.replayed && !(a.status == http.StatusAccepted && w.kind.external()) &&
				(first.IsZero() || a.answered.Before(first)) {
				first = a.answered
			}
		}
		w.mu.Unlock()
	}
	return first, !first.IsZero()
}

// attempt finds the attempt named id.
func (d *driver) attempt(id string) (attempt, bool) {
	for _, w := range d.writes() {
		w.mu.Lock()
		for _, a := range w.attempts {
			if a.id == id {
				w.mu.Unlock()
				return a, true
			}
		}
		w.mu.Unlock()
	}
	return attempt{}, false
}

// answers counts, by status and problem code, the answers of attempts answered after from and sent before to.
func (d *driver) answers(from, to time.Time) map[string]int {
	out := map[string]int{}
	for _, w := range d.writes() {
		w.mu.Lock()
		for _, a := range w.attempts {
			if a.answered.Before(from) || !a.sent.Before(to) {
				continue
			}
			label := strconv.Itoa(a.status) + " " + a.code
			switch {
			case a.status == 0:
				label = "no answer"
			case a.success() && a.replayed:
				label = strconv.Itoa(a.status) + " replayed"
			case a.success():
				label = strconv.Itoa(a.status)
			}
			out[label]++
		}
		w.mu.Unlock()
	}
	return out
}
