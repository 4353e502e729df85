package failovertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/services/payments"
)

// TestFailover: see the package documentation. Each case prints its figures (acknowledged, lost and doubled
// writes, seconds from the kill to the first successful write, the answers sent during the cut, audit verify).
func TestFailover(t *testing.T) {
	if os.Getenv("RETRYSAFE_FAILOVER") == "" {
		t.Skip("make test-failover runs this (RETRYSAFE_FAILOVER=1): it starts PostgreSQL clusters of its own")
	}
	// One after the other: each case is a machine's worth of processes.
	t.Run("synchronous", func(t *testing.T) { testFailover(t, "sync") })
	t.Run("asynchronous", func(t *testing.T) { testFailover(t, "async") })
}

// testFailover: load on the three services, the primary killed and the standby promoted mid-load. In
// synchronous mode no acknowledged write may be lost; in asynchronous mode the standby stops streaming before the
// kill, so the newest commits are lost for certain, captures and authorizations among them. In both modes every
// write, sent again under its key, ends with exactly one effect, and no answer said "nothing was done" for a
// claim that committed. Then the old primary comes back as a standby, and the services do not write to it.
func testFailover(t *testing.T, mode string) {
	c := startCluster(t, mode)
	s := startStack(t, c)
	d := newDriver(t, s, mode)

	stop := make(chan struct{})
	wait := d.load(6, stop)
	if mode == "async" {
		// Payments through the real agent binary too, whose journal then says what was acknowledged.
		d.agent = newAgentDriver(t, s, "ag-"+mode)
		loadWait, agentWait := wait, d.agent.load(t, stop)
		wait = func() { loadWait(); agentWait() }
	}
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			wait()
		}
	}()
	until(t, "30 jobs done before the kill", time.Minute, func() bool { return d.done.Load() >= 30 })
	if mode == "async" {
		c.must("detach")
		detached := time.Now()
		until(t, "writes of every kind acknowledged by the primary alone, a deploy among them activated", time.Minute, func() bool {
			for _, k := range kinds {
				if d.ackedSince(detached, k) < 3 {
					return false
				}
			}
			return activatedSince(t, s, d, detached) > 0 && d.agent.capturedSince(detached) > 0
		})
	}
	killed := c.kill()
	c.must("promote")
	promoted := time.Now()
	doneAtPromotion := d.done.Load()
	until(t, "30 jobs done after the promotion", 3*time.Minute, func() bool { return d.done.Load() >= doneAtPromotion+30 })
	close(stop)
	stopped = true
	wait()
	firstWrite, ok := d.firstWriteAfter(killed)
	if !ok {
		t.Fatal("no write succeeded after the kill")
	}

	primary, _ := c.connect("primary")
	// The healing step, before anything is sent again: the books equal the provider's.
	f, lost := lostWrites(t, d, primary)
	restored := healed(t, s, primary, c.nodes()["primary"].url())
	followUps := catchUps(t, s, d, lost)
	if d.agent != nil {
		// The agent's step after such a failover: every action its journal holds as acknowledged, asked for
		// and made again under its key where the service lost it.
		f.agentChecked, f.agentLost, f.agentRemade = d.agent.verify(t)
		booksEqualProvider(t, s, primary)
	}
	f = check(t, s, d, primary, killed, mode == "async", f, lost, followUps)
	f.restored, f.caughtUp, f.adopted = restored, len(followUps), aheadOfLost(t, s, primary, followUps)
	booksEqualProvider(t, s, primary) // and still, once every write was sent again under its key
	if d.agent != nil {
		d.agent.exactlyOnce(t, primary)
	}
	if mode == "async" && restored == 0 {
		t.Error("the sweep restored nothing after the asynchronous failover: the healing step proved nothing")
	}
	f.toPromoted, f.toFirstWrite, f.cut = promoted.Sub(killed), firstWrite.Sub(killed), d.answers(killed, firstWrite)
	out, intact := s.auditVerify(t, c.nodes()["primary"].url())
	f.audit = strings.TrimSpace(out)
	if !intact {
		t.Errorf("audit verify on the new primary:\n%s", out)
	}
	if mode == "sync" && f.total(f.lost) > 0 {
		t.Errorf("synchronous standby: %d acknowledged writes lost", f.total(f.lost))
	}
	if mode == "async" && f.caughtUp == 0 {
		t.Error("no deploy the target had activated was lost: the asynchronous case proved nothing about deploys")
	}
	if mode == "async" && f.reclaimed == 0 {
		t.Error("no payment write was lost after its provider call: the asynchronous case proved nothing")
	}
	t.Log(f.String(mode))

	rejoined(t, c, s, primary, mode)
	if mode == "sync" {
		commitWaitsForLostStandby(t, c, s)
	}
}

// figures are what a failover did to the writes.
type figures struct {
	acked, lost, doubled map[kind]int
	// reclaimed counts payment writes acknowledged before the kill whose claim was lost with the old primary:
	// sent again, they were claimed anew, and the provider replayed their first call.
	reclaimed int
	// repeatedActivations counts activation calls the target answered from its marker.
	repeatedActivations int
	// failedDeploys counts deploys acknowledged (queued) whose progress was lost with the old primary: failed
	// by the reconciler, not activated.
	failedDeploys int
	// notSent counts payment writes settled as "never reached the provider, nothing happened; send it again
	// with a new key": a claim cut by the kill, its provider call never made. Their jobs went on with new keys.
	notSent int
	// restored counts provider effects the sweep restored from the provider's record before anything was sent
	// again (restore operations).
	restored int
	// caughtUp counts environments caught up with the target's marker by a deploy planned on the version a lost
	// deploy made; adopted, those lost deploys whose same-key retry was recorded from the marker, not run again.
	caughtUp, adopted int
	// agentChecked counts the actions `retrysafe agent verify` found acknowledged in the agent's journal;
	// agentLost, those the services had lost; agentRemade, those it made again.
	agentChecked, agentLost, agentRemade int
	toPromoted, toFirstWrite             time.Duration
	cut                                  map[string]int // answers to attempts in flight at the kill or sent until the first write
	audit                                string
}

func (f figures) total(m map[kind]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func (f figures) String(mode string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s standby: acknowledged %d, lost %d, doubled %d", mode, f.total(f.acked), f.total(f.lost), f.total(f.doubled))
	for _, k := range kinds {
		fmt.Fprintf(&b, "; %s %d/%d/%d", k, f.acked[k], f.lost[k], f.doubled[k])
	}
	fmt.Fprintf(&b, "\n  payment writes lost after their provider call, claimed again and replayed by the provider: %d", f.reclaimed)
	fmt.Fprintf(&b, "\n  provider effects restored by the sweep before anything was sent again: %d", f.restored)
	fmt.Fprintf(&b, "\n  payment writes settled as never sent (nothing happened; the job went on under a new key): %d", f.notSent)
	fmt.Fprintf(&b, "\n  deploys failed, not activated, their progress lost with the old primary: %d", f.failedDeploys)
	fmt.Fprintf(&b, "\n  activations called again and answered from the target's marker: %d", f.repeatedActivations)
	fmt.Fprintf(&b, "\n  environments caught up with the target after an activated deploy was lost: %d; the lost deploys' retries adopted from the marker: %d",
		f.caughtUp, f.adopted)
	if f.agentChecked > 0 {
		fmt.Fprintf(&b, "\n  agent verify: %d acknowledged actions in the journal, %d lost with the old primary, %d made again",
			f.agentChecked, f.agentLost, f.agentRemade)
	}
	fmt.Fprintf(&b, "\n  kill to promoted %.1f s, kill to first successful write %.1f s (%.1f s after the promotion)",
		f.toPromoted.Seconds(), f.toFirstWrite.Seconds(), (f.toFirstWrite - f.toPromoted).Seconds())
	fmt.Fprintf(&b, "\n  answers to attempts in flight at the kill or sent before the first successful write:")
	for _, label := range slices.Sorted(maps.Keys(f.cut)) {
		fmt.Fprintf(&b, " %s ×%d;", label, f.cut[label])
	}
	fmt.Fprintf(&b, "\n  audit verify on the new primary: %s", f.audit)
	return b.String()
}

// lostWrites counts the acknowledged writes the new primary does not have, before anything heals or is sent again.
func lostWrites(t *testing.T, d *driver, db *pgx.Conn) (figures, map[*write]bool) {
	t.Helper()
	f := figures{acked: map[kind]int{}, lost: map[kind]int{}, doubled: map[kind]int{}}
	lost := map[*write]bool{}
	for _, w := range d.writes() {
		if ack, _ := w.acked(); ack != nil {
			f.acked[w.kind]++
			if !present(t, db, w) {
				f.lost[w.kind]++
				lost[w] = true
			}
		}
	}
	return f, lost
}

// check counts, on the new primary and at the provider, what became of every write: acknowledged writes lost
// (before anything is sent again), then, once every write has been sent again under its key, the effects of
// each key, and the answers that said "nothing was done" for a claim that committed.
func check(t *testing.T, s *stack, d *driver, db *pgx.Conn, killed time.Time, mayLose bool, f figures, lost map[*write]bool, followUps []followUp) figures {
	t.Helper()
	ctx := t.Context()

	// Every job again, as an agent that never heard back (or doubts what it heard) would: the same keys, the same
	// bodies. A write whose acknowledgement survived is answered with it again, byte for byte.
	var wg sync.WaitGroup
	jobs := make(chan *job)
	for range 4 {
		wg.Go(func() {
			for j := range jobs {
				d.run(j)
			}
		})
	}
	d.mu.Lock()
	all := slices.Clone(d.jobs)
	d.mu.Unlock()
	for _, j := range all {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	for _, u := range followUps {
		d.send(u.w, "/v1/deploys")
	}
	keys := []string{}
	for _, w := range d.writes() {
		keys = append(keys, w.key)
		ack, _ := w.acked()
		switch {
		case w.notSent:
			f.notSent++ // its answer is checked with the provider's record below
		case w.last == nil || w.last.Code >= 300:
			t.Errorf("%s: sent again, answered %s; want a success", w.key, describe(w.last))
		case ack != nil && !lost[w] && (w.last.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(w.last.Body, ack.Body)):
			t.Errorf("%s: sent again, answered %s (replayed %q); want its acknowledgement again: %s", w.key, w.last.Body,
				w.last.Header.Get("Idempotent-Replayed"), ack.Body)
		}
	}

	// Deploys run in the background: every one must end, and succeed.
	until(t, "every deploy finished", 2*time.Minute, func() bool {
		return count(t, db, `SELECT count(*) FROM deploys WHERE environment LIKE 'fo-' || $1 || '-%' AND state NOT IN ('succeeded', 'failed', 'cancelled')`, d.name) == 0
	})

	// Exactly one effect per key: tickets in the database, authorizations and captures at the provider,
	// activations at the target.
	effects := map[string]int{}
	add := func(db *pgx.Conn, sql string, prefix string) {
		rows, err := db.Query(ctx, sql, d.name)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var n, good int
			if err := rows.Scan(&name, &n, &good); err != nil {
				t.Fatal(err)
			}
			effects[prefix+name] = n
			if good != n {
				t.Errorf("%s%s: %d effects, %d of them as they should end", prefix, name, n, good)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	add(db, `SELECT title, count(*), count(*) FROM tickets WHERE project = 'failover' AND title LIKE $1 || '-%' GROUP BY title`, "t-")
	add(db, `SELECT order_id, count(*) FILTER (WHERE status <> 'failed'), count(*) FILTER (WHERE status = 'succeeded' AND captured_minor = amount_minor)
FROM payment_intents WHERE order_id LIKE $1 || '-%' GROUP BY order_id`, "pi-")
	// Deploys by id (an environment of a lost deploy also has the deploy that caught it up), activations at the
	// target, whose database did not fail over.
	add(db, `SELECT id, count(*), count(*) FROM deploys WHERE environment LIKE 'fo-' || $1 || '-%' GROUP BY id`, "d ")
	add(s.target, `SELECT deploy_id, count(*), count(*)
FROM deploy_target_activations WHERE environment LIKE 'fo-' || $1 || '-%' GROUP BY deploy_id`, "activation ")
	// The controller activates again when the database failed under its first call (the target answers from its
	// marker): calls, not activations.
	f.repeatedActivations = count(t, s.target, `SELECT coalesce(sum(calls - 1), 0) FROM deploy_target_activations WHERE environment LIKE 'fo-' || $1 || '-%'`, d.name)
	// A deploy that did not succeed, and its history.
	unsucceeded := map[string]string{}
	rows, err := db.Query(ctx, `SELECT d.id, d.state || ': ' || string_agg(e.type || ' ' || e.detail::text, '; ' ORDER BY e.id)
FROM deploys d JOIN operation_events e ON e.operation_id = d.operation_id
WHERE d.environment LIKE 'fo-' || $1 || '-%' AND d.state <> 'succeeded' GROUP BY d.id, d.state`, d.name)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key, history string
		if err := rows.Scan(&key, &history); err != nil {
			t.Fatal(err)
		}
		unsucceeded[key] = history
	}
	rows.Close()
	var account string
	if err := db.QueryRow(ctx, `SELECT account_id FROM operations WHERE idempotency_key = $1`, keys[0]).Scan(&account); err != nil {
		t.Fatal(err)
	}
	for _, w := range d.writes() {
		n := 0
		switch w.kind {
		case kindTicket:
			n = effects[w.key]
		case kindDeploy:
			// The deploy is one row; its effect, the activation at the target, happened once if it succeeded.
			// A deploy whose progress was lost with the old primary cannot go on under its fencing token: the
			// reconciler finds no marker and queues it again under the same operation (deploys.MaxAttempts), so
			// it fails only after that. A lost deploy sent again under its key is the same deploy (its id comes
			// from the key), adopted from the target's marker when the target had activated it.
			id := answerID(w.last)
			if ack, _ := w.acked(); ack != nil && answerID(ack) != id {
				t.Errorf("%s: sent again, answered deploy %s; acknowledged as %s", w.key, id, answerID(ack))
			}
			n = max(effects["d "+id], effects["activation "+id])
			history, failed := unsucceeded[id]
			switch {
			case effects["d "+id] != 1:
				t.Errorf("%s: %d deploys %s; want 1", w.key, effects["d "+id], id)
			case failed && (!mayLose || effects["activation "+id] != 0):
				t.Errorf("%s: %d activations, %s", w.key, effects["activation "+id], history)
			case failed:
				f.failedDeploys++
				t.Logf("%s: its progress was lost with the old primary: %s", w.key, history)
				n = 1
			}
		case kindIntent, kindCapture:
			look, err := s.provider.Lookup(ctx, payments.DownstreamKey(opstatus.Operation{AccountID: account, IdempotencyKey: w.key}))
			switch {
			case err != nil:
				t.Fatal(err)
			case w.notSent && look.Found:
				t.Errorf("%s: answered %s, but the provider has a call under its key: %+v", w.key, describe(w.last), look)
			case w.notSent:
				continue // nothing happened under this key; its job went on with a new one
			case !look.Found:
				t.Errorf("%s: the provider has no call under its key", w.key)
			}
			n = len(look.Effects)
			if order, _, _ := strings.Cut(w.key, "-again"); w.kind == kindIntent && effects[order] != 1 {
				t.Errorf("%s: %d intents for its order not failed; want 1", w.key, effects[order])
			}
		}
		switch {
		case n == 0:
			t.Errorf("%s: no effect", w.key)
		case n > 1:
			f.doubled[w.kind] += n - 1
		}
	}
	counters, err := s.provider.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var paymentJobs int64
	for _, j := range all {
		if j.writes[0].kind == kindIntent {
			paymentJobs++
		}
	}
	authorizations, captures := paymentJobs, paymentJobs
	if d.agent != nil {
		a, c := d.agent.providerCalls(t, account)
		authorizations, captures = authorizations+a, captures+c
	}
	if counters["authorize"] != authorizations || counters["capture"] != captures {
		t.Errorf("provider executed %v; want %d authorizations and %d captures, one per payment (the agent's among them)", counters, authorizations, captures)
	}
	for _, k := range kinds {
		if f.doubled[k] > 0 {
			t.Errorf("%d %s writes took effect twice", f.doubled[k], k)
		}
	}

	// "Nothing was done" (503 store_unavailable) never answers an attempt whose claim committed with a local
	// write, or whose provider call was sent; nothing is ever a 500.
	rows, err = db.Query(ctx, `SELECT o.idempotency_key, e.detail->>'attempt_id', o.created_at,
       EXISTS (SELECT 1 FROM operation_events x WHERE x.operation_id = o.id AND x.type = $2)
FROM operations o JOIN operation_events e ON e.operation_id = o.id AND e.type = $3
WHERE o.idempotency_key = ANY($1)`, keys, opstore.EventDispatchStarted, opstore.EventClaimed)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]*write{}
	for _, w := range d.writes() {
		byKey[w.key] = w
	}
	for rows.Next() {
		var key, attemptID string
		var created time.Time
		var dispatched bool
		if err := rows.Scan(&key, &attemptID, &created, &dispatched); err != nil {
			t.Fatal(err)
		}
		w := byKey[key]
		a, ok := d.attempt(attemptID)
		if ok && a.status == http.StatusServiceUnavailable && a.code == "store_unavailable" && (!w.kind.external() || dispatched) {
			t.Errorf("%s: attempt %s was answered 503 store_unavailable, but its claim committed (dispatched: %t)", key, attemptID, dispatched)
		}
		if _, at := w.acked(); w.kind.external() && !at.IsZero() && at.Before(killed) && created.After(killed) {
			f.reclaimed++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for label, n := range d.answers(time.Time{}, time.Now()) {
		if strings.HasPrefix(label, "500") {
			t.Errorf("%d attempts answered %s", n, label)
		}
	}
	return f
}

// answerID is the id an answer names, "" when it names none.
func answerID(res *apitest.Response) string {
	var b struct {
		ID string `json:"id"`
	}
	if res != nil {
		_ = json.Unmarshal(res.Body, &b)
	}
	return b.ID
}

// present reports whether the acknowledged effect of w is on the database.
func present(t *testing.T, db *pgx.Conn, w *write) bool {
	t.Helper()
	ack, _ := w.acked()
	var res struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(ack.Body, &res); err != nil || res.ID == "" {
		t.Fatalf("%s: acknowledged with %s: no id", w.key, ack.Body)
	}
	sql := map[kind]string{
		kindTicket: `SELECT count(*) FROM tickets WHERE id = $1`,
		// The intent with its authorization recorded: a claim whose recorded result was lost left it authorizing.
		kindIntent:  `SELECT count(*) FROM payment_intents WHERE id = $1 AND status <> 'authorizing'`,
		kindCapture: `SELECT count(*) FROM payment_intents WHERE id = $1 AND status = 'succeeded'`,
		kindDeploy:  `SELECT count(*) FROM deploys WHERE id = $1`,
	}[w.kind]
	// The acknowledgement too, byte for byte: the sweep may have restored a lost payment's rows from the provider
	// before this count, and a claim that survived while its completion was lost has been settled again by the
	// recovery worker since, with an answer of its own.
	return count(t, db, sql, res.ID) == 1 &&
		count(t, db, `SELECT count(*) FROM operations WHERE idempotency_key = $1 AND response_body = $2`, w.key, ack.Body) > 0
}

func count(t *testing.T, db *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// rejoined brings the old primary back as a standby of the new one (failover.sh rejoin), cuts every connection
// of the services so that each reconnects through the host list, which names the old primary first, and sends
// a round of writes: every one is acknowledged and on the new primary, and no service is connected to the old.
func rejoined(t *testing.T, c *cluster, s *stack, primary *pgx.Conn, mode string) {
	t.Helper()
	c.must("rejoin")
	old, n := c.connect("standby")
	var inRecovery bool
	if err := old.QueryRow(t.Context(), `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("node %s after rejoin: in recovery %t, %v; want a standby", n.name, inRecovery, err)
	}
	if _, err := primary.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, appName); err != nil {
		t.Fatal(err)
	}
	d := newDriver(t, s, mode+"-rejoined")
	for i := range 6 {
		d.run(d.newJob(i))
	}
	for _, w := range d.writes() {
		if ack, _ := w.acked(); ack == nil || !present(t, primary, w) {
			t.Errorf("%s after the rejoin: answered %s, on the new primary: %t", w.key, describe(w.last), ack != nil && present(t, primary, w))
		}
	}
	// Connections that lived longer than a check of target_session_attrs (which opens one to the old primary
	// first, finds it read-only and closes it).
	// The services' pools keep their connections idle after the writes: wait until some is older than that check.
	settled := `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND backend_start < now() - interval '1 second'`
	var onOld, onNew int
	for range 100 {
		if onNew = count(t, primary, settled, appName); onNew > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	onOld = count(t, old, settled, appName)
	if onOld != 0 || onNew == 0 {
		t.Errorf("services' connections: %d to the old primary (node %s), %d to the new one; want none, some", onOld, n.name, onNew)
	}
	t.Logf("old primary (node %s) rejoined as a standby: %d writes acknowledged, all on the new primary; services' connections: %d to the new primary, %d to the old", n.name, len(d.writes()), onNew, onOld)
}

// commitWaitsForLostStandby: a primary whose synchronous standby is gone before synchronous_standby_names is
// cleared (a promoted standby that kept the setting) commits locally, then waits for the standby for as long as
// it takes: PostgreSQL turns statement_timeout off before that wait. The services cut the connection at their
// statement bound, and a ticket whose COMMIT was cut is answered 503 outcome_unknown, never store_unavailable:
// it committed. A retry of it meanwhile waits on the key's row lock until statement_timeout cancels it: this
// attempt changed nothing (store_unavailable). A capture whose claim's COMMIT was cut sent nothing; whatever
// it is answered, the provider captures at most once, and its final answer says what the provider did. Once
// the setting is cleared, the commits become visible and the same keys settle.
func commitWaitsForLostStandby(t *testing.T, c *cluster, s *stack) {
	t.Helper()
	d := newDriver(t, s, "commit-wait")
	in := &write{kind: kindIntent, key: "pi-commit-wait", body: `{"order_id":"commit-wait","amount_minor":500,"currency":"USD"}`}
	res := d.send(in, "/v1/payment_intents")
	var intent struct {
		ID                      string `json:"id"`
		ProviderAuthorizationID string `json:"provider_authorization_id"`
	}
	if res == nil || json.Unmarshal(res.Body, &intent) != nil {
		t.Fatalf("intent: %s", describe(res))
	}
	capturePath := "/v1/payment_intents/" + intent.ID + "/capture"
	c.must("detach")

	const key, body = "t-commit-wait", `{"project":"failover","title":"commit-wait"}`
	var wg sync.WaitGroup
	var retry, capture *apitest.Response
	wg.Go(func() {
		time.Sleep(time.Second) // while the first attempt's COMMIT waits
		retry, _ = s.tickets.Try(http.MethodPost, "/v1/tickets", body, apitest.Key(key))
	})
	wg.Go(func() {
		capture, _ = s.payments.Try(http.MethodPost, capturePath, `{}`, apitest.Key("pc-commit-wait"))
	})
	res, err := s.tickets.Try(http.MethodPost, "/v1/tickets", body, apitest.Key(key))
	wg.Wait()
	if err != nil || res.Code != http.StatusServiceUnavailable || problemCode(res) != "outcome_unknown" {
		t.Fatalf("ticket whose COMMIT waits for a lost standby: %v %s; want 503 outcome_unknown", err, describe(res))
	}
	for what, r := range map[string]*apitest.Response{"its retry": retry, "a capture": capture} {
		if r == nil || r.Code != http.StatusServiceUnavailable {
			t.Errorf("%s while the primary's commits wait: %s; want 503", what, describe(r))
		}
	}
	t.Logf("commits waiting for a lost synchronous standby: the ticket %d %s, its retry %d %s, a capture %d %s",
		res.Code, problemCode(res), retry.Code, problemCode(retry), capture.Code, problemCode(capture))

	c.must("standalone")
	res = d.send(&write{kind: kindTicket, key: key, body: body}, "/v1/tickets")
	if res == nil || res.Code != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the ticket's key once the standby setting is cleared: %s; want the committed ticket, replayed", describe(res))
	}
	db, _ := c.connect("primary")
	if n := count(t, db, `SELECT count(*) FROM tickets WHERE title = 'commit-wait'`); n != 1 {
		t.Fatalf("%d tickets; want 1", n)
	}
	res = d.send(&write{kind: kindCapture, key: "pc-commit-wait", body: `{}`}, capturePath)
	auth, err := s.provider.GetAuthorization(t.Context(), intent.ProviderAuthorizationID)
	if err != nil {
		t.Fatal(err)
	}
	captured := auth.CapturedMinor > 0
	if res == nil || captured != (res.Code == http.StatusOK) {
		t.Fatalf("the capture's key once the setting is cleared: %s; the provider captured %d", describe(res), auth.CapturedMinor)
	}
	t.Logf("then the ticket's key replayed the one ticket; the capture's key answered %d %s (the provider captured %d)",
		res.Code, problemCode(res), auth.CapturedMinor)
}

// until polls cond until it holds, failing the test after bound: a synchronisation point, not a timing assertion.
func until(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s", what, bound)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
