package bench

import (
	"bufio"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	var lats []time.Duration
	for i := 1; i <= 100; i++ {
		lats = append(lats, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := Percentile(lats, c.p); got != c.want {
			t.Errorf("Percentile(1..100 ms, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Percentile(nil, 0.99); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	samples := []Sample{{30 * time.Millisecond, 201}, {10 * time.Millisecond, 201}, {20 * time.Millisecond, 409},
		{5 * time.Second, 0}}
	r := Summarize("retrysafe", "create", samples, 2*time.Second)
	if r.Requests != 4 || r.RPS != 2 {
		t.Errorf("requests %d, rps %v; want 4 and 2", r.Requests, r.RPS)
	}
	// The transport error counts as a request and an "error" status, but has no latency.
	if r.Max != 30*time.Millisecond || r.P50 != 20*time.Millisecond {
		t.Errorf("p50 %v max %v; want 20ms and 30ms", r.P50, r.Max)
	}
	if got := Statuses(r.Statuses); got != "2 x 201, 1 x 409, 1 x error" {
		t.Errorf("Statuses = %q", got)
	}
	if r.Rows != -1 {
		t.Errorf("Rows = %d, want -1 (not counted)", r.Rows)
	}
}

func TestTable(t *testing.T) {
	t.Parallel()
	base := Result{Target: "baseline", Mode: "create", Requests: 50000, RPS: 5000, P50: 5 * time.Millisecond,
		P99: 20 * time.Millisecond, Max: 80 * time.Millisecond, Statuses: map[string]int{"201": 50000}, Rows: 50000}
	rs := Result{Target: "retrysafe", Mode: "storm", Requests: 1000, RPS: 2500, P50: 200 * time.Millisecond,
		P99: 390 * time.Millisecond, Max: 401500 * time.Microsecond, Statuses: map[string]int{"201": 1000}, Rows: 1, RSS: 61_000_000}
	pg := Result{Target: "pgbench insert", Mode: "create", Requests: 90000, RPS: 9000, Statuses: map[string]int{}, Rows: -1}
	var b strings.Builder
	if err := Table(&b, []Result{pg, base, rs}, base, "baseline create"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want a header and 3 rows:\n%s", len(lines), b.String())
	}
	want := [][]string{
		{"target", "mode", "requests", "req/s", "p50", "ms", "p99", "ms", "max", "ms", "statuses", "rows", "peak", "RSS", "req/s", "vs", "baseline", "create", "p99", "vs", "baseline", "create"},
		{"pgbench", "insert", "create", "90000", "9000", "-", "-", "-", "-", "-", "-", "1.80x", "-"},
		{"baseline", "create", "50000", "5000", "5.0", "20", "80", "50000", "x", "201", "50000", "-", "1.00x", "1.00x"},
		{"retrysafe", "storm", "1000", "2500", "200", "390", "402", "1000", "x", "201", "1", "61.0", "MB", "0.50x", "19.50x"},
	}
	for i, l := range lines {
		if got := strings.Fields(l); strings.Join(got, " ") != strings.Join(want[i], " ") {
			t.Errorf("line %d = %q, want fields %q", i, l, want[i])
		}
	}
	// Columns are aligned: every line is as long as the header.
	for i, l := range lines {
		if len(l) != len(lines[0]) {
			t.Errorf("line %d is %d wide, the header %d:\n%s", i, len(l), len(lines[0]), b.String())
		}
	}
	if got := Summary(base, Result{RPS: 750, P99: 70 * time.Millisecond}, Result{RPS: 2000}, rs); got !=
		"create 0.15x baseline (p99 70 ms vs 20 ms, 3.50x), replay 0.40x, storm max 402 ms, statuses 1000 x 201, rows 1" {
		t.Errorf("Summary = %q", got)
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	in := "Name:\tretrysafe\nVmPeak:\t 1265432 kB\nVmHWM:\t   48320 kB\nVmRSS:\t   41000 kB\nThreads:\t9\n"
	m := ParseStatus(bufio.NewScanner(strings.NewReader(in)))
	if m["VmHWM"] != 48320*1024 || m["VmRSS"] != 41000*1024 {
		t.Errorf("VmHWM %d VmRSS %d", m["VmHWM"], m["VmRSS"])
	}
	if _, ok := m["Threads"]; ok {
		t.Error("Threads has no kB unit and should be skipped")
	}
	if got := (Memory{PeakRSS: 41000 * 1024, HWM: 48320 * 1024}).Peak(); MB(got) != "49.5 MB" {
		t.Errorf("Peak = %s", MB(got))
	}
}

func TestCountAndURL(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{10_000_000: "10M", 2_500_000: "2.5M", 250_000: "250k", 1234: "1234"} {
		if got := Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
	s := Server{Base: "postgres://postgres@127.0.0.1:5432/"}
	if got := s.URL("bench_tickets"); got != "postgres://postgres@127.0.0.1:5432/bench_tickets?sslmode=disable" {
		t.Errorf("URL = %q", got)
	}
}
