package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// The API keys the services run with (acct_a's agent secret is what the load sends), as ../shared/bench/run.sh
// sets them.
const (
	apiKeys     = "acct_a:agent:ka-agent-secret-0001-long-enough,acct_a:approver:ka-approver-secret-0001-long-enough,acct_b:agent:kb-agent-secret-0001-long-enough"
	agentSecret = "ka-agent-secret-0001-long-enough"
	// DefaultKeyIDSecret keys the services' key ids when API_KEY_ID_SECRET is not set: any 32+ characters do.
	DefaultKeyIDSecret = "bench-secret-0123456789abcdef0123456789"
)

// Target names in results.
const (
	TargetPgbench       = "pgbench insert"
	TargetBaseline      = "baseline"
	TargetCeiling       = "ceiling"
	TargetSchemaCeiling = "schema-ceiling"
	TargetTickets       = "retrysafe"
	TargetPayments      = "payments"
	targetGrowthFmt     = "retrysafe, %s preloaded"
)

// Config is one run of the harness.
type Config struct {
	Server Server
	// Bin is the retrysafe binary; Self this harness's binary, started as `Self baseline` for the baseline,
	// `Self ceiling` for the ceiling and `Self schema-ceiling` for the schema ceiling.
	Bin, Self string
	// Duration of each timed mode, Warmup of the untimed create before them; Clients the concurrency; Storm the
	// copies of one key sent at once; ReplayKeys the stored keys replay cycles over.
	Duration, Warmup time.Duration
	Clients, Storm   int
	ReplayKeys       int
	// Pgbench adds pgbench's one-row insert (the machine's limit) when the pgbench command is found.
	Pgbench bool
	// Ceiling adds the ceiling (ServeCeiling): the baseline with the least idempotency, a stored key.
	Ceiling bool
	// SchemaCeiling adds the schema ceiling (ServeSchemaCeiling): the ceiling writing retrysafe's rows into
	// retrysafe's schema.
	SchemaCeiling bool
	Payments      bool
	// Preload, when > 0, adds the growth run: a database with Preload completed creates (opstore.BenchPreload, in
	// batches of PreloadBatch), measured with create and replay.
	Preload      int64
	PreloadBatch int64
	// PreloadFor, when > 0, bounds the loading: the growth run measures with what was loaded by then.
	PreloadFor time.Duration
	// KeyIDSecret is API_KEY_ID_SECRET for the services.
	KeyIDSecret string
	// Chart, when set, is where the PNG goes.
	Chart  string
	LogDir string
	Out    io.Writer
	// Progress receives what is running and how long it has left; TTY rewrites one line.
	Progress io.Writer
	TTY      bool
}

// Report is what a run measured.
type Report struct {
	Results []Result
	// Memory is the peak of each retrysafe process, by name.
	Memory map[string]Memory
	// MemoryOrder is the order the processes ran in.
	MemoryOrder []string
	// Preloaded is how many creates the growth database held, and how long loading and sealing them took.
	Preloaded             int64
	PreloadTook, SealTook time.Duration
	PreloadBytes          int64
	// Unsealed is how many loaded records the audit sequencer had not sealed when the growth run began.
	Unsealed int64
	// LoadStart and Load are the load averages (1, 5, 15 minutes) when the run began and ended.
	LoadStart, Load        string
	Started, Finished      time.Time
	Duration               time.Duration
	Clients, Storm, Phases int
}

type harness struct {
	cfg   Config
	rep   *Report
	phase int
	total int
	mu    sync.Mutex
	dbs   []string
}

// Run measures everything the config asks for. The databases it makes are dropped at the end, also on error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	h := &harness{cfg: cfg, rep: &Report{Memory: map[string]Memory{}, Started: time.Now(), Duration: cfg.Duration,
		Clients: cfg.Clients, Storm: cfg.Storm}}
	if cfg.Pgbench {
		if _, err := exec.LookPath("pgbench"); err != nil {
			h.say("pgbench not found: its insert limit is left out")
			h.cfg.Pgbench = false
		}
	}
	plan := h.plan()
	for _, s := range plan {
		h.total += s.phases
	}
	h.rep.Phases = h.total
	defer h.dropDatabases(ctx)
	h.rep.LoadStart = loadavg()
	for _, s := range plan {
		if err := s.run(ctx); err != nil {
			return nil, err
		}
	}
	h.rep.Finished = time.Now()
	h.rep.Load = loadavg()
	return h.rep, nil
}

// step is one target's measurement and the number of phases it shows.
type step struct {
	phases int
	run    func(context.Context) error
}

// plan is what the config asks to measure, in the order it runs.
func (h *harness) plan() []step {
	var plan []step
	add := func(wanted bool, phases int, run func(context.Context) error) {
		if wanted {
			plan = append(plan, step{phases, run})
		}
	}
	reference := func(target string) func(context.Context) error {
		return func(ctx context.Context) error { return h.reference(ctx, target) }
	}
	// The growth run goes first: loading takes long and the machine's load drifts meanwhile, so the empty-table
	// runs it is compared with are measured right after it, not an hour before.
	add(h.cfg.Preload > 0, 6, h.growth) // load, seal, warm-up, create, single client, replay
	add(h.cfg.Pgbench, 1, h.pgbench)
	// Each ticket target: warm-up, create, single client, replay, storm.
	add(true, 5, reference(TargetBaseline))
	add(h.cfg.Ceiling, 5, reference(TargetCeiling))
	add(h.cfg.SchemaCeiling, 5, reference(TargetSchemaCeiling))
	add(true, 5, func(ctx context.Context) error { return h.tickets(ctx, TargetTickets, "bench_tickets", 0) })
	add(h.cfg.Payments, 3, h.payments) // warm-up, intent create, capture
	return plan
}

// growth measures the tickets service on tables already holding cfg.Preload completed creates.
func (h *harness) growth(ctx context.Context) error {
	if err := h.tickets(ctx, h.growthTarget(), "bench_growth", h.cfg.Preload); err != nil {
		return err
	}
	// Its 10M rows are not needed any more: dropped now, not at the end, to give the disk back.
	if err := h.cfg.Server.Drop(ctx, "bench_growth"); err != nil {
		h.say("drop bench_growth: %v", err)
	}
	return nil
}

// dropDatabases drops the databases the run made, also when ctx is over.
func (h *harness) dropDatabases(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, db := range h.dbs {
		if err := h.cfg.Server.Drop(dctx, db); err != nil {
			h.say("drop %s: %v", db, err)
		}
	}
}

// Count renders n as 10M, 250k or 1234.
func Count(n int64) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.FormatInt(n, 10)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func (h *harness) say(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cfg.TTY {
		fmt.Fprint(h.cfg.Progress, "\r\033[K")
	}
	fmt.Fprintf(h.cfg.Progress, "bench: "+format+"\n", args...)
}

// timed shows a phase of known length while fn runs: its number, name and the seconds left.
func (h *harness) timed(name string, d time.Duration, fn func()) {
	h.phase++
	label := fmt.Sprintf("[%d/%d] %s", h.phase, h.total, name)
	h.show(label, func(elapsed time.Duration) string {
		left := (d - elapsed).Round(time.Second)
		if left < 0 {
			return "finishing"
		}
		return fmt.Sprintf("%s left", left)
	}, fn)
}

// untimed shows a phase whose length is not known; status tells how far it is.
func (h *harness) untimed(name string, status func(elapsed time.Duration) string, fn func()) {
	h.phase++
	h.show(fmt.Sprintf("[%d/%d] %s", h.phase, h.total, name), status, fn)
}

func (h *harness) show(label string, status func(time.Duration) string, fn func()) {
	t0 := time.Now()
	h.say("%s", label)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		every := 5 * time.Second
		if h.cfg.TTY {
			every = time.Second
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				h.mu.Lock()
				if h.cfg.TTY {
					fmt.Fprintf(h.cfg.Progress, "\r\033[Kbench: %s: %s", label, status(time.Since(t0)))
				} else {
					fmt.Fprintf(h.cfg.Progress, "bench: %s: %s\n", label, status(time.Since(t0)))
				}
				h.mu.Unlock()
			}
		}
	}()
	fn()
	close(done)
	wg.Wait()
}

func (h *harness) fresh(ctx context.Context, db string) error {
	h.dbs = append(h.dbs, db)
	return h.cfg.Server.Fresh(ctx, db)
}

func (h *harness) logPath(name string) string {
	return filepath.Join(h.cfg.LogDir, strings.NewReplacer(" ", "-", ",", "").Replace(name)+".log")
}

func (h *harness) serviceEnv(db string) []string {
	return []string{
		"DATABASE_URL=" + h.cfg.Server.URL(db),
		"API_KEYS=" + apiKeys,
		"API_KEY_ID_SECRET=" + h.cfg.KeyIDSecret,
		"RATE_LIMIT_WRITES_PER_SECOND=0",
	}
}

func (h *harness) record(r Result) Result {
	h.rep.Results = append(h.rep.Results, r)
	if len(r.Statuses) == 0 {
		h.say("   %s %s: %.0f per second", r.Target, r.Mode, r.RPS)
		return r
	}
	h.say("   %s %s: %.0f req/s, p50 %s ms, p99 %s ms, max %s ms, %s", r.Target, r.Mode, r.RPS, Ms(r.P50), Ms(r.P99),
		Ms(r.Max), Statuses(r.Statuses))
	return r
}

var tpsLine = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)

// pgbench measures PostgreSQL's durable one-row insert with the same clients: what no server on it can pass.
func (h *harness) pgbench(ctx context.Context) error {
	const db = "bench_pg"
	if err := h.fresh(ctx, db); err != nil {
		return err
	}
	c, err := pgx.Connect(ctx, h.cfg.Server.URL(db))
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, `CREATE TABLE t (id text PRIMARY KEY, account_id text, project text, title text, priority text, status text, created_at timestamptz DEFAULT now())`)
	c.Close(ctx)
	if err != nil {
		return err
	}
	script := filepath.Join(h.cfg.LogDir, "pgbench-insert.sql")
	if err := os.WriteFile(script, []byte("insert into t (id, account_id, project, title, priority, status) values (gen_random_uuid()::text, 'a', 'bench', md5(random()::text), 'normal', 'open');\n"), 0o644); err != nil {
		return err
	}
	var out []byte
	var runErr error
	h.timed("pgbench one-row insert (the database's limit)", h.cfg.Duration, func() {
		cmd := exec.CommandContext(ctx, "pgbench", "-n", "-c", fmt.Sprint(h.cfg.Clients), "-j", "2",
			"-T", fmt.Sprint(int(h.cfg.Duration.Seconds())), "-f", script, h.cfg.Server.URL(db))
		out, runErr = cmd.CombinedOutput()
	})
	if runErr != nil {
		return fmt.Errorf("pgbench: %w\n%s", runErr, out)
	}
	m := tpsLine.FindSubmatch(out)
	if m == nil {
		return fmt.Errorf("pgbench printed no tps:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	h.record(Result{Target: TargetPgbench, Mode: "create", RPS: tps, Seconds: h.cfg.Duration.Seconds(),
		Requests: int(tps * h.cfg.Duration.Seconds()), Statuses: map[string]int{}, Rows: -1})
	return nil
}

// reference measures a reference server of this harness's own binary (`Self baseline`, `Self ceiling`,
// `Self schema-ceiling`) on a fresh database.
func (h *harness) reference(ctx context.Context, target string) error {
	db := "bench_" + target
	if err := h.fresh(ctx, db); err != nil {
		return err
	}
	addr, err := FreeAddr()
	if err != nil {
		return err
	}
	p, err := Start(target, h.logPath(target), h.cfg.Self, []string{target},
		[]string{"DATABASE_URL=" + h.cfg.Server.URL(db), "ADDR=" + addr})
	if err != nil {
		return err
	}
	// Its memory too: what the same load costs a server with no idempotency (or the least) is the yardstick
	// for retrysafe's.
	mem := p.SampleMemory(200 * time.Millisecond)
	defer h.stop(p, target)
	if err := p.WaitReady("http://"+addr+"/healthz", 30*time.Second); err != nil {
		return err
	}
	return h.ticketModes(ctx, target, db, "http://"+addr, true, mem)
}

// tickets measures `retrysafe serve tickets` on a fresh database, first loaded with preload completed creates
// when preload > 0.
func (h *harness) tickets(ctx context.Context, target, db string, preload int64) error {
	if err := h.fresh(ctx, db); err != nil {
		return err
	}
	addr, err := FreeAddr()
	if err != nil {
		return err
	}
	env := append(h.serviceEnv(db), "TICKETS_ADDR="+addr)
	if preload > 0 {
		if err := run(ctx, h.serviceEnv(db), h.cfg.Bin, "migrate"); err != nil {
			return err
		}
		if err := h.preload(ctx, db, preload); err != nil {
			return err
		}
		target = h.growthTarget()
		if err := h.sealPreloaded(ctx, target, db, addr, env); err != nil {
			return err
		}
	}
	p, err := Start(target, h.logPath(target), h.cfg.Bin, []string{"serve", "tickets"}, env)
	if err != nil {
		return err
	}
	mem := p.SampleMemory(200 * time.Millisecond)
	defer h.stop(p, target)
	if err := p.WaitReady("http://"+addr+"/readyz", 2*time.Minute); err != nil {
		return err
	}
	return h.ticketModes(ctx, target, db, "http://"+addr, preload == 0, mem)
}

// sealPreloaded has the loaded records sealed before the growth run is measured, by a `serve tickets` of its own,
// so that the measurement does not share the machine with the sealing. The measured process is started after it,
// as the empty tables' run is.
func (h *harness) sealPreloaded(ctx context.Context, target, db, addr string, env []string) error {
	name := target + " (sealing)"
	p, err := Start(name, h.logPath(name), h.cfg.Bin, []string{"serve", "tickets"},
		append(env[:len(env):len(env)], "AUDIT_SEAL_INTERVAL=1s"))
	if err != nil {
		return err
	}
	p.SampleMemory(200 * time.Millisecond)
	defer h.stop(p, name)
	if err := p.WaitReady("http://"+addr+"/readyz", 2*time.Minute); err != nil {
		return err
	}
	return h.seal(ctx, db)
}

// growthTarget names the growth run by what was loaded (what was asked for, before loading).
func (h *harness) growthTarget() string {
	if h.rep.Preloaded > 0 {
		return fmt.Sprintf(targetGrowthFmt, Count(h.rep.Preloaded))
	}
	return fmt.Sprintf(targetGrowthFmt, Count(h.cfg.Preload))
}

func ticketRequest(base, key string) Request {
	return Request{Method: "POST", URL: base + "/v1/tickets", Key: key,
		Body: []byte(`{"project":"bench","title":"ticket ` + key + `","priority":"normal"}`)}
}

// measuring is one target being measured: its database, the client the load is sent with and the sampler of
// its memory (nil: not sampled).
type measuring struct {
	h          *harness
	target, db string
	client     *Client
	mem        *MemSampler
}

// peak is the target's largest memory since the last call (0 when not sampled), and starts over.
func (m *measuring) peak() int64 {
	if m.mem == nil {
		return 0
	}
	return m.mem.PhasePeak()
}

// warmUp runs l as the untimed phase name, then analyzes the database, so that the measured modes start
// with statistics of a table that holds rows.
func (m *measuring) warmUp(ctx context.Context, name string, l Load) error {
	m.h.timed(name, l.Duration, func() { l.Run(ctx, m.client) })
	m.peak()
	if err := m.h.cfg.Server.Analyze(ctx, m.db); err != nil {
		return fmt.Errorf("%s: analyze after the warm-up: %w", m.target, err)
	}
	return nil
}

// measure runs l as the timed phase name and records it as the target's mode, with rowsSince counting
// ($1: the time the phase began) the rows the target wrote.
func (m *measuring) measure(ctx context.Context, name, mode string, l Load, rowsSince string) {
	since := time.Now()
	var samples []Sample
	var took time.Duration
	m.h.timed(name, l.Duration, func() { samples, took = l.Run(ctx, m.client) })
	m.record(ctx, mode, samples, took, rowsSince, since)
}

// record records the samples of the target's mode with the memory peak of the phase and the rows that rows
// (given args) counts.
func (m *measuring) record(ctx context.Context, mode string, samples []Sample, took time.Duration, rows string, args ...any) {
	r := Summarize(m.target, mode, samples, took)
	r.RSS = m.peak()
	r.Rows, _ = m.h.cfg.Server.Query1(ctx, m.db, rows, args...)
	m.h.record(r)
}

const ticketsSince = `SELECT count(*) FROM tickets WHERE created_at >= $1`

// ticketModes runs warm-up, create, replay and (with storm) the storm against one target.
func (h *harness) ticketModes(ctx context.Context, target, db, base string, storm bool, mem *MemSampler) error {
	c := NewClient(agentSecret, h.cfg.Clients*2)
	defer c.Close()
	m := &measuring{h: h, target: target, db: db, client: c, mem: mem}
	newTicket := func(int64) (Request, bool) { return ticketRequest(base, Key()), true }
	create := Load{Clients: h.cfg.Clients, Duration: h.cfg.Warmup, Next: newTicket}
	if err := m.warmUp(ctx, target+" warm-up (create, not counted)", create); err != nil {
		return err
	}
	create.Duration = h.cfg.Duration
	m.measure(ctx, target+" create (a new key each request)", "create", create, ticketsSince)
	if err := ctx.Err(); err != nil {
		return err
	}
	// One client alone: the latency of a create on an idle server, not its throughput.
	single := Load{Clients: 1, Duration: h.cfg.Duration / 2, Next: newTicket}
	m.measure(ctx, target+" single client (create, one at a time)", "single", single, ticketsSince)
	if err := ctx.Err(); err != nil {
		return err
	}
	keys, err := m.storeTickets(ctx, base, h.cfg.ReplayKeys)
	if err != nil {
		return err
	}
	replay := Load{Clients: h.cfg.Clients, Duration: h.cfg.Duration, Next: func(n int64) (Request, bool) {
		return ticketRequest(base, keys[n%int64(len(keys))]), true
	}}
	m.measure(ctx, fmt.Sprintf("%s replay (%d stored keys again)", target, len(keys)), "replay", replay, ticketsSince)
	if !storm || ctx.Err() != nil {
		return ctx.Err()
	}
	// The storm's copies are the only connections: the modes before leave none idle, which would otherwise hold
	// places of the service's connection cap (HTTP_MAX_CONNS) until its idle timeout.
	c.Close()
	m.storm(ctx, base)
	return nil
}

// storeTickets creates n tickets, untimed, for replay to send again, and returns their keys.
func (m *measuring) storeTickets(ctx context.Context, base string, n int) ([]string, error) {
	keys := make([]string, n)
	var seedErr error
	var seedMu sync.Mutex
	seed := Load{Clients: m.h.cfg.Clients, Duration: 5 * time.Minute, Next: func(n int64) (Request, bool) {
		if n >= int64(len(keys)) {
			return Request{}, false
		}
		keys[n] = Key()
		return ticketRequest(base, keys[n]), true
	}, Answer: func(r Request, status int, _ []byte) {
		if status < 200 || status >= 300 {
			seedMu.Lock()
			seedErr = fmt.Errorf("%s: storing replay keys: status %d", m.target, status)
			seedMu.Unlock()
		}
	}}
	seed.Run(ctx, m.client)
	m.peak()
	return keys, seedErr
}

// storm sends cfg.Storm copies of one new ticket at once, each on a connection of its own, and records how
// many tickets they made.
func (m *measuring) storm(ctx context.Context, base string) {
	sc := NewClient(agentSecret, m.h.cfg.Storm)
	defer sc.Close()
	key := Key()
	var samples []Sample
	var took time.Duration
	m.h.untimed(fmt.Sprintf("%s storm (%d copies of one key at once)", m.target, m.h.cfg.Storm),
		func(e time.Duration) string { return fmt.Sprintf("%s so far", e.Round(time.Second)) },
		func() { samples, took = Storm(ctx, sc, ticketRequest(base, key), m.h.cfg.Storm) })
	m.record(ctx, "storm", samples, took, `SELECT count(*) FROM tickets WHERE title = $1`, "ticket "+key)
}

// preload loads n completed creates into db with opstore.BenchPreload, in batches, showing how far it is.
func (h *harness) preload(ctx context.Context, db string, n int64) error {
	c, err := pgx.Connect(ctx, h.cfg.Server.URL(db))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	// Creates of the last hours (keys are kept 72 h: none is old enough to be pruned during the run).
	t0 := time.Now().Add(-2 * time.Hour)
	batch := max(h.cfg.PreloadBatch, 1)
	var done int64
	start := time.Now()
	var loadErr error
	h.untimed(fmt.Sprintf("growth: loading %s completed creates (opstore.BenchPreload)", Count(n)),
		func(e time.Duration) string {
			d := done
			if d == 0 {
				return fmt.Sprintf("%s so far", e.Round(time.Second))
			}
			left := time.Duration(float64(e) / float64(d) * float64(n-d))
			return fmt.Sprintf("%s of %s, %.0f/s, about %s left", Count(d), Count(n), float64(d)/e.Seconds(), left.Round(time.Second))
		},
		func() {
			for from := int64(0); from < n && loadErr == nil; from += batch {
				if h.cfg.PreloadFor > 0 && time.Since(start) > h.cfg.PreloadFor {
					h.say("   -preload-for %s is over: %s of %s loaded", h.cfg.PreloadFor, Count(done), Count(n))
					break
				}
				to := min(from+batch, n)
				if err := opstore.BenchPreload(ctx, c, from, to, t0); err != nil {
					loadErr = err
					break
				}
				done = to
			}
		})
	if loadErr != nil {
		return loadErr
	}
	// What autovacuum would have done to tables this old: visibility map and statistics.
	if _, err := c.Exec(ctx, `VACUUM (ANALYZE) tickets`); err != nil {
		return fmt.Errorf("preload: vacuum: %w", err)
	}
	if err := opstore.BenchVacuum(ctx, c); err != nil {
		return fmt.Errorf("preload: vacuum: %w", err)
	}
	h.rep.Preloaded = done
	h.rep.PreloadTook = time.Since(start)
	_ = c.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&h.rep.PreloadBytes)
	h.say("   loaded %s creates in %s; database %s", Count(done), h.rep.PreloadTook.Round(time.Second), MB(h.rep.PreloadBytes))
	return nil
}

// seal waits until the service's audit sequencer has sealed every loaded record.
func (h *harness) seal(ctx context.Context, db string) error {
	c, err := pgx.Connect(ctx, h.cfg.Server.URL(db))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	start := time.Now()
	var left int64 = -1
	var sealErr error
	best, progressed := int64(-1), time.Now()
	h.untimed("growth: the service's audit sequencer seals the loaded records",
		func(time.Duration) string { return fmt.Sprintf("%s records left", Count(left)) },
		func() {
			for {
				// Nothing else writes meanwhile: every record not counted by a seal is waiting for one.
				// The operations' records are constant meanwhile, so counting them apart from the rest is exact.
				ops, err := opstore.BenchRecordCount(ctx, c)
				if err == nil {
					err = c.QueryRow(ctx, `SELECT (SELECT count(*) FROM approval_events) - (SELECT coalesce(sum(record_count), 0) FROM audit_seals)`).Scan(&left)
				}
				if err != nil {
					sealErr = err
					return
				}
				left += ops
				if left == 0 {
					return
				}
				if best < 0 || left < best {
					best, progressed = left, time.Now()
				}
				// The sequencer seals batch after batch; one that stopped sealing (its statement timed out on
				// this machine, say) is reported, and the run goes on with the rest unsealed.
				if time.Since(progressed) > 2*time.Minute {
					h.rep.Unsealed = left
					h.say("   the audit sequencer sealed nothing for 2 minutes: measuring with %s records unsealed (see %s)", Count(left), h.logPath(h.growthTarget()+" (sealing)"))
					return
				}
				select {
				case <-ctx.Done():
					sealErr = ctx.Err()
					return
				case <-time.After(2 * time.Second):
				}
			}
		})
	h.rep.SealTook = time.Since(start)
	if _, err := c.Exec(ctx, `VACUUM (ANALYZE) audit_seals`); err != nil && sealErr == nil {
		sealErr = err
	}
	return sealErr
}

// payments measures `retrysafe serve payments`, with the provider sandbox behind it, on a fresh database.
func (h *harness) payments(ctx context.Context) error {
	const db = "bench_payments"
	if err := h.fresh(ctx, db); err != nil {
		return err
	}
	paddr, err := FreeAddr()
	if err != nil {
		return err
	}
	prov, err := Start("provider", h.logPath("provider"), h.cfg.Bin, []string{"provider"},
		append(h.serviceEnv(db), "PROVIDER_ADDR="+paddr))
	if err != nil {
		return err
	}
	prov.SampleMemory(200 * time.Millisecond)
	defer h.stop(prov, "provider (sandbox)")
	if err := prov.WaitReady("http://"+paddr+"/healthz", 30*time.Second); err != nil {
		return err
	}
	addr, err := FreeAddr()
	if err != nil {
		return err
	}
	p, err := Start(TargetPayments, h.logPath(TargetPayments), h.cfg.Bin, []string{"serve", "payments"},
		append(h.serviceEnv(db), "PAYMENTS_ADDR="+addr, "PROVIDER_URL=http://"+paddr))
	if err != nil {
		return err
	}
	mem := p.SampleMemory(200 * time.Millisecond)
	defer h.stop(p, TargetPayments)
	base := "http://" + addr
	if err := p.WaitReady(base+"/readyz", 2*time.Minute); err != nil {
		return err
	}
	return h.paymentModes(ctx, db, base, p.Log, mem)
}

// stop stops p and records its memory as name's.
func (h *harness) stop(p *Proc, name string) {
	h.rep.Memory[name] = p.Stop()
	h.rep.MemoryOrder = append(h.rep.MemoryOrder, name)
}

// paymentModes runs warm-up, intent create and capture against the payments service at base (its log at log).
func (h *harness) paymentModes(ctx context.Context, db, base, log string, mem *MemSampler) error {
	c := NewClient(agentSecret, h.cfg.Clients*2)
	defer c.Close()
	m := &measuring{h: h, target: TargetPayments, db: db, client: c, mem: mem}
	var mu sync.Mutex
	var intents []string
	create := Load{Clients: h.cfg.Clients, Duration: h.cfg.Warmup,
		Next: func(int64) (Request, bool) {
			k := Key()
			return Request{Method: "POST", URL: base + "/v1/payment_intents", Key: k,
				Body: []byte(`{"order_id":"bench-` + k + `","amount_minor":2500,"currency":"USD"}`)}, true
		},
		Answer: func(_ Request, status int, body []byte) {
			if status != 201 {
				return
			}
			var v struct{ ID string }
			if json.Unmarshal(body, &v) == nil && v.ID != "" {
				mu.Lock()
				intents = append(intents, v.ID)
				mu.Unlock()
			}
		}}
	if err := m.warmUp(ctx, "payments warm-up (intent create, not counted)", create); err != nil {
		return err
	}
	create.Duration = h.cfg.Duration
	m.measure(ctx, "payments intent create (authorize at the sandbox; a new key and order each)", "intent create", create,
		`SELECT count(*) FROM payment_intents WHERE created_at >= $1`)
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(intents) == 0 {
		return errors.New("payments: no intent was created; see " + log)
	}
	// Capture each intent made above once, under a new key; the run ends early when they run out.
	pool := intents
	capture := Load{Clients: h.cfg.Clients, Duration: h.cfg.Duration, Next: func(n int64) (Request, bool) {
		if n >= int64(len(pool)) {
			return Request{}, false
		}
		return Request{Method: "POST", URL: base + "/v1/payment_intents/" + pool[n] + "/capture", Key: Key(),
			Body: []byte(`{}`)}, true
	}}
	m.measure(ctx, fmt.Sprintf("payments capture (%d intents, each once, a new key each)", len(pool)), "capture", capture,
		`SELECT count(*) FROM payment_intents WHERE status = 'succeeded' AND updated_at >= $1`)
	return ctx.Err()
}
