package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Ms renders a duration in milliseconds, one decimal below 10 ms.
func Ms(d time.Duration) string {
	ms := float64(d.Microseconds()) / 1000
	if ms < 10 {
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

// Statuses renders status counts as "1000 x 201, 3 x error", most frequent first.
func Statuses(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var s []kv
	for k, v := range m {
		s = append(s, kv{k, v})
	}
	sort.Slice(s, func(i, j int) bool {
		if s[i].v != s[j].v {
			return s[i].v > s[j].v
		}
		return s[i].k < s[j].k
	})
	parts := make([]string, len(s))
	for i, e := range s {
		parts[i] = fmt.Sprintf("%d x %s", e.v, e.k)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// Ratio renders a/b as "0.15x", "-" when b is zero.
func Ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// Table writes results as an aligned table. ref is the result each row is compared to (its req/s and p99),
// named refName in the header; a zero ref leaves the ratio columns out.
func Table(w io.Writer, rows []Result, ref Result, refName string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "target\tmode\trequests\treq/s\tp50 ms\tp99 ms\tmax ms\tstatuses\trows\tpeak RSS\t"
	if ref.RPS > 0 {
		head += "req/s vs " + refName + "\tp99 vs " + refName + "\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		rowsCol := "-"
		if r.Rows >= 0 {
			rowsCol = fmt.Sprint(r.Rows)
		}
		p50, p99, mx, p99Ratio := Ms(r.P50), Ms(r.P99), Ms(r.Max), Ratio(float64(r.P99), float64(ref.P99))
		if len(r.Statuses) == 0 { // pgbench: a rate, no latencies of ours
			p50, p99, mx, p99Ratio = "-", "-", "-", "-"
		}
		line := fmt.Sprintf("%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t", r.Target, r.Mode, r.Requests, r.RPS,
			p50, p99, mx, Statuses(r.Statuses), rowsCol, rssCol(r.RSS))
		if ref.RPS > 0 {
			line += Ratio(r.RPS, ref.RPS) + "\t" + p99Ratio + "\t"
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// Find returns the result of target and mode, and whether there is one.
func Find(rows []Result, target, mode string) (Result, bool) {
	for _, r := range rows {
		if r.Target == target && r.Mode == mode {
			return r, true
		}
	}
	return Result{}, false
}

// Summary is the one line compare.sh prints, for the same run: retrysafe's create, p99, replay and storm
// against the baseline's create.
func Summary(base, create, replay, storm Result) string {
	return fmt.Sprintf("create %s baseline (p99 %s ms vs %s ms, %s), replay %s, storm max %s ms, statuses %s, rows %d",
		Ratio(create.RPS, base.RPS), Ms(create.P99), Ms(base.P99), Ratio(float64(create.P99), float64(base.P99)),
		Ratio(replay.RPS, base.RPS), Ms(storm.Max), Statuses(storm.Statuses), storm.Rows)
}

// MB renders bytes in megabytes (10^6), one decimal.
func MB(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }

// Print writes the report: the tickets table against the baseline's create, the payments table against the
// tickets create, the growth table against the empty-table run, the peak memory of each process and the
// summary line.
func Print(w io.Writer, rep *Report) error {
	fmt.Fprintf(w, "\nretrysafe bench, %s, %d clients, %s per mode, storm of %d; load average %s at the start, %s at the end\n\n",
		rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Clients, rep.Duration, rep.Storm, rep.LoadStart, rep.Load)
	base, _ := Find(rep.Results, TargetBaseline, "create")
	var tickets, payments, growth []Result
	for _, r := range rep.Results {
		switch {
		case r.Target == TargetPayments:
			payments = append(payments, r)
		case strings.HasSuffix(r.Target, " preloaded"):
			growth = append(growth, r)
		default:
			tickets = append(tickets, r)
		}
	}
	fmt.Fprintln(w, "tickets (POST /v1/tickets), compared to the baseline's create:")
	if err := Table(w, tickets, base, "baseline create"); err != nil {
		return err
	}
	create, _ := Find(rep.Results, TargetTickets, "create")
	if len(payments) > 0 {
		fmt.Fprintln(w, "\npayments (POST /v1/payment_intents, then .../capture; the provider sandbox over HTTP), compared to the tickets create:")
		if err := Table(w, payments, create, "tickets create"); err != nil {
			return err
		}
	}
	if len(growth) > 0 {
		fmt.Fprintf(w, "\ngrowth: %s completed creates loaded first (%s, loaded in %s, sealed in %s), compared to the empty tables' run:\n",
			Count(rep.Preloaded), MB(rep.PreloadBytes), rep.PreloadTook.Round(time.Second), rep.SealTook.Round(time.Second))
		if rep.Unsealed > 0 {
			fmt.Fprintf(w, "(%s loaded records were still unsealed when it was measured)\n", Count(rep.Unsealed))
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\tmode\trequests\treq/s\tp50 ms\tp99 ms\tmax ms\tstatuses\trows\tpeak RSS\treq/s vs empty\tp99 vs empty\t")
		for _, r := range growth {
			empty, _ := Find(rep.Results, TargetTickets, r.Mode)
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t\n", r.Target, r.Mode, r.Requests, r.RPS,
				Ms(r.P50), Ms(r.P99), Ms(r.Max), Statuses(r.Statuses), r.Rows, rssCol(r.RSS), Ratio(r.RPS, empty.RPS),
				Ratio(float64(r.P99), float64(empty.P99)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.MemoryOrder) > 0 {
		fmt.Fprintln(w, "\npeak resident memory of each process over its whole run (VmHWM, and the largest VmRSS sampled from /proc/PID/status every 200 ms; goal < 60 MB; the tables above show the largest VmRSS in each mode):")
		for _, name := range rep.MemoryOrder {
			m := rep.Memory[name]
			fmt.Fprintf(w, "  %-36s %s (VmHWM %s, VmRSS max %s, %d samples)\n", name, MB(m.Peak()), MB(m.HWM), MB(m.PeakRSS), m.Samples)
		}
	}
	replay, _ := Find(rep.Results, TargetTickets, "replay")
	storm, _ := Find(rep.Results, TargetTickets, "storm")
	goals(w, rep)
	fmt.Fprintln(w)
	fmt.Fprintln(w, Summary(base, create, replay, storm))
	return nil
}

// goals writes retrysafe's figures against the goals of the performance issue, each a ratio to a server of the
// same run: the ceiling (the baseline's insert plus a stored key) for throughput, p99 and the storm; the
// baseline for one client's latency and for memory.
func goals(w io.Writer, rep *Report) {
	get := func(target, mode string) Result { r, _ := Find(rep.Results, target, mode); return r }
	ceil := func(mode string) Result { return get(TargetCeiling, mode) }
	rs := func(mode string) Result { return get(TargetTickets, mode) }
	if ceil("create").RPS == 0 || rs("create").RPS == 0 {
		return
	}
	fmt.Fprintln(w, "\ngoals, against this run's ceiling (throughput, p99, storm) and baseline (one client, memory):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  create\t%.0f req/s vs %.0f\t%s\tgoal >= 0.60x\n", rs("create").RPS, ceil("create").RPS,
		Ratio(rs("create").RPS, ceil("create").RPS))
	fmt.Fprintf(tw, "  create p99\t%s ms vs %s ms\t%s\tgoal <= 2.00x\n", Ms(rs("create").P99), Ms(ceil("create").P99),
		Ratio(float64(rs("create").P99), float64(ceil("create").P99)))
	fmt.Fprintf(tw, "  replay\t%.0f req/s vs %.0f\t%s\tgoal >= 0.50x (aim 0.70x)\n", rs("replay").RPS, ceil("replay").RPS,
		Ratio(rs("replay").RPS, ceil("replay").RPS))
	fmt.Fprintf(tw, "  storm, all answered\t%.2f s vs %.2f s\t%s\tgoal <= 1.25x; %s, %d rows\n", rs("storm").Seconds,
		ceil("storm").Seconds, Ratio(rs("storm").Seconds, ceil("storm").Seconds), Statuses(rs("storm").Statuses), rs("storm").Rows)
	b, one := get(TargetBaseline, "single"), rs("single")
	fmt.Fprintf(tw, "  one client, p50\t%s ms vs %s ms\t%s\tgoal <= 2.00x; p99 %s ms vs %s ms\n", Ms(one.P50), Ms(b.P50),
		Ratio(float64(one.P50), float64(b.P50)), Ms(one.P99), Ms(b.P99))
	mem, baseMem := rep.Memory[TargetTickets].Peak(), rep.Memory[TargetBaseline].Peak()
	fmt.Fprintf(tw, "  peak RSS\t%s vs %s\t%s\tgoal <= 1.25x\n", MB(mem), MB(baseMem), Ratio(float64(mem), float64(baseMem)))
	// No goal: how far the rows alone (the schema ceiling) are from the ceiling, and retrysafe from them.
	if schema := func(mode string) Result { return get(TargetSchemaCeiling, mode) }; schema("create").RPS > 0 {
		for _, mode := range []string{"create", "replay"} {
			fmt.Fprintf(tw, "  %s, schema ceiling\t%.0f req/s vs %.0f\t%s\tretrysafe %s of it\n", mode, schema(mode).RPS,
				ceil(mode).RPS, Ratio(schema(mode).RPS, ceil(mode).RPS), Ratio(rs(mode).RPS, schema(mode).RPS))
		}
	}
	_ = tw.Flush()
}

func rssCol(b int64) string {
	if b <= 0 {
		return "-"
	}
	return MB(b)
}
