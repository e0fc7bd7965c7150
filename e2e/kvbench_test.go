//go:build kvbench

package e2e

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/bench"
)

// TestKVRoutingComparison is the full measurement behind docs/performance.md
// (make bench-kv): shared-prefix, multi-turn, conversation and trace workloads against
// kv-aware, round-robin and least-load, plus one simulator holding the whole
// fleet's cache. It is built only with -tags kvbench and writes the reports, plots
// and the markdown table into INFERA_KV_BENCH_OUT. Every TTFT figure and check is
// given twice: measured by infera bench, and modelled by the simulators' step
// model (--model-ttft-log), which the box's load does not move.
func TestKVRoutingComparison(t *testing.T) {
	outDir := os.Getenv("INFERA_KV_BENCH_OUT")
	if outDir == "" {
		t.Fatal("set INFERA_KV_BENCH_OUT=DIR for the reports (make bench-kv does)")
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	const workers, kvBlocks = 4, 400
	trace := traceFixture(t)
	workloads := []kvWorkload{
		sharedPrefix(640),
		// 13 sessions, not a multiple of the 4 workers: the closed loop sends
		// a round's turns in session order, so with 16 sessions request i
		// is session i mod 16 and round-robin sends it to worker i mod 4 —
		// every session back to the same worker every turn, a session
		// affinity no real round-robin has (its hit ratio then moved
		// 0.29–0.58 from run to run with the dispatch order).
		{name: "multi-turn", args: []string{"--workload", "multi-turn", "--sessions", "13", "--turns", "5",
			"--input-len", "40", "--output-len", "16", "--requests", "780", "--concurrency", "8", "--seed", "2"}},
		// Sessions shaped by published chat-trace statistics
		// (bench/conversation.go), scaled to the simulators' 6400-token
		// context: short messages, a few shared system prompts, bursty
		// arrivals, think times compressed 50×.
		{name: "conversation", args: []string{"--workload", "conversation", "--requests", "300", "--turns", "3",
			"--input-len", "12", "--output-len", "24", "--prefix-groups", "8", "--prefix-len", "60",
			"--rate", "6", "--trace-time-scale", "0.02", "--max-inflight", "64", "--seed", "4"}},
		{name: "trace", args: []string{"--workload", "trace", "--trace", trace,
			"--trace-block-words", "8", "--trace-time-scale", "0", "--concurrency", "8", "--seed", "3"}},
	}
	// Tuning runs: INFERA_KV_BENCH_KV_ARGS adds `infera serve` flags to the
	// kv-aware fleet (e.g. "--kv-recent-weight 0"); INFERA_KV_BENCH_ONLY
	// (comma-separated labels) runs only those fleets and skips the plots and
	// checks, which need all four.
	kvArgs := strings.Fields(os.Getenv("INFERA_KV_BENCH_KV_ARGS"))
	only := map[string]bool{}
	for _, l := range strings.Split(os.Getenv("INFERA_KV_BENCH_ONLY"), ",") {
		if l = strings.TrimSpace(l); l != "" {
			only[l] = true
		}
	}
	// INFERA_KV_BENCH_WORKLOADS (comma-separated names) runs only those
	// workloads (with the plots and checks that concern them).
	if names := os.Getenv("INFERA_KV_BENCH_WORKLOADS"); names != "" {
		keep := map[string]bool{}
		for _, n := range strings.Split(names, ",") {
			keep[strings.TrimSpace(n)] = true
		}
		var sel []kvWorkload
		for _, wl := range workloads {
			if keep[wl.name] {
				sel = append(sel, wl)
			}
		}
		if len(sel) == 0 {
			t.Fatalf("INFERA_KV_BENCH_WORKLOADS=%s names none of the workloads", names)
		}
		workloads = sel
	}
	// Fairness (issue 37): the fleets run interleaved, A B C D A B C D …,
	// INFERA_KV_BENCH_REPEATS times (at least 3), so that a change of the
	// box's load over the run hits every fleet alike; each figure is the
	// median over the repeats, and a percentile of kv-aware is judged
	// against round-robin's with an ε taken from round-robin against
	// itself: the largest relative difference between two of its repeats
	// at that percentile, floored at what one repeat's samples resolve
	// (bench.PercentileTolerance: the 95% interval of the percentile from
	// its order statistics). Three repeats of a percentile made of cold
	// prefills, the same under every policy, agreed to 0.1 ms on a quiet
	// box (ε 0.00), and the check then failed on a 1–2% difference that
	// the 780 samples of each repeat cannot tell apart.
	repeats := 3
	if v := os.Getenv("INFERA_KV_BENCH_REPEATS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("INFERA_KV_BENCH_REPEATS=%q: want a positive count", v)
		}
		repeats = n
	}
	fleets := []kvFleet{
		{policy: "kv-aware", workers: workers, kvBlocks: kvBlocks, serveArgs: kvArgs},
		{policy: "round-robin", workers: workers, kvBlocks: kvBlocks},
		{policy: "least-load", workers: workers, kvBlocks: kvBlocks},
		{policy: "round-robin", workers: 1, kvBlocks: workers * kvBlocks},
	}
	// Each TTFT figure twice: measured by `infera bench` (the box's load
	// moves it) and modelled by the simulators' step model (their
	// --model-ttft-log lines; the load does not move it).
	runs := map[string]map[string][]benchReport{} // fleet label → workload → report per repeat
	measured, modelled := ttftRepeats{}, ttftRepeats{}
	// Each request's TTFT alone on an idle engine (the simulators'
	// model_idle_ttft_s): the floor a fleet's cache hits leave.
	floors := ttftRepeats{}
	all := true
	for r := range repeats {
		dir := filepath.Join(outDir, fmt.Sprintf("r%d", r+1))
		for _, fl := range fleets {
			label := fl.label()
			if len(only) > 0 && !only[label] {
				all = false
				continue
			}
			res := runKVFleet(t, fl, workloads, dir)
			if runs[label] == nil {
				runs[label] = map[string][]benchReport{}
			}
			for _, wl := range workloads {
				runs[label][wl.name] = append(runs[label][wl.name], res[wl.name])
				// The simulators' modelled mean is kept only in memory (not in
				// the report file): logged, so that an INFERA_KV_BENCH_ONLY run,
				// which prints no table, still has it.
				t.Logf("%s on %s, repeat %d: modelled TTFT mean %.2f ms", wl.name, label, r+1, res[wl.name].ModelTTFTMs)
				measured.add(label, wl.name, ttftSamples(t, filepath.Join(dir, fmt.Sprintf("%s-%s.json", wl.name, strings.ReplaceAll(label, " ", "-")))))
				modelled.add(label, wl.name, res[wl.name].ModelTTFTsMs)
				floors.add(label, wl.name, res[wl.name].ModelIdleTTFTsMs)
			}
		}
	}
	if !all {
		t.Logf("INFERA_KV_BENCH_ONLY=%q: reports in %s, no plots or checks", os.Getenv("INFERA_KV_BENCH_ONLY"), outDir)
		return
	}
	// One TTFT CDF plot per workload, every fleet of the last repeat on it.
	last := filepath.Join(outDir, fmt.Sprintf("r%d", repeats))
	for _, wl := range workloads {
		plotArgs := []string{"bench", "plot"}
		for _, label := range kvPolicies {
			plotArgs = append(plotArgs, filepath.Join(last, fmt.Sprintf("%s-%s.json", wl.name, strings.ReplaceAll(label, " ", "-"))))
		}
		plotArgs = append(plotArgs, "-o", filepath.Join(outDir, wl.name+"-ttft-cdf.svg"))
		if out, err := exec.Command(binary, plotArgs...).CombinedOutput(); err != nil {
			t.Errorf("infera %v: %v\n%s", plotArgs, err, out)
		}
	}
	med := func(label, wl string, f func(benchReport) float64) float64 {
		var v []float64
		for _, rep := range runs[label][wl] {
			v = append(v, f(rep))
		}
		return median(v)
	}
	var table strings.Builder
	fmt.Fprintf(&table, "%d interleaved repeats; medians over the repeats. Measured TTFT: `infera bench`'s, which the box's load moves. "+
		"Modelled TTFT: the simulators' own step model per request (--model-ttft-log), independent of the box's load.\n\n", repeats)
	table.WriteString("| workload | policy | hit ratio | TTFT mean ms measured | TTFT mean ms modelled | TTFT p50 ms measured | TTFT p99 ms measured | req/s | max/fair share |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, wl := range workloads {
		for _, policy := range kvPolicies {
			n := workers
			if policy == "one big cache" {
				n = 1
			}
			fmt.Fprintf(&table, "| %s | %s | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", wl.name, policy,
				med(policy, wl.name, hitRatio), med(policy, wl.name, func(r benchReport) float64 { return r.TTFT["mean"] }),
				med(policy, wl.name, func(r benchReport) float64 { return r.ModelTTFTMs }),
				med(policy, wl.name, func(r benchReport) float64 { return r.TTFT["p50"] }),
				med(policy, wl.name, func(r benchReport) float64 { return r.TTFT["p99"] }),
				med(policy, wl.name, func(r benchReport) float64 { return r.Throughput.ReqPerS }),
				med(policy, wl.name, func(r benchReport) float64 { return fairShareRatio(r, n) }))
		}
	}
	// The per-percentile comparison, measured then modelled: kv-aware over
	// round-robin, and ε from round-robin against itself.
	kinds := []struct {
		name string
		r    ttftRepeats
	}{{"measured", measured}, {"modelled", modelled}}
	type tolerance struct{ eps, spread, floor []float64 }
	tol := map[string]map[string]tolerance{} // kind → workload → ε per percentile
	for _, kind := range kinds {
		tol[kind.name] = map[string]tolerance{}
		fmt.Fprintf(&table, "\nTTFT %s:\n\n| workload | |", kind.name)
		for _, q := range kvPercentiles {
			fmt.Fprintf(&table, " p%g |", q)
		}
		table.WriteString("\n|---|---|" + strings.Repeat("---:|", len(kvPercentiles)) + "\n")
		for _, wl := range workloads {
			tl := tolerance{make([]float64, len(kvPercentiles)), make([]float64, len(kvPercentiles)), make([]float64, len(kvPercentiles))}
			for k, q := range kvPercentiles {
				tl.eps[k], tl.spread[k], tl.floor[k] = bench.PercentileTolerance(kind.r["round-robin"][wl.name], q)
			}
			tol[kind.name][wl.name] = tl
			for _, policy := range kvPolicies {
				fmt.Fprintf(&table, "| %s | %s ms %s |", wl.name, policy, kind.name)
				for _, x := range kind.r.medians(policy, wl.name) {
					fmt.Fprintf(&table, " %.1f |", x)
				}
				table.WriteString("\n")
			}
			kvp, rrp := kind.r.medians("kv-aware", wl.name), kind.r.medians("round-robin", wl.name)
			fmt.Fprintf(&table, "| %s | kv-aware / round-robin %s |", wl.name, kind.name)
			for k := range kvPercentiles {
				fmt.Fprintf(&table, " %.2f |", kvp[k]/rrp[k])
			}
			fmt.Fprintf(&table, "\n| %s | ε = max(spread, floor) |", wl.name)
			for _, x := range tl.eps {
				fmt.Fprintf(&table, " %.3f |", x)
			}
			fmt.Fprintf(&table, "\n| %s | spread (round-robin vs itself) |", wl.name)
			for _, x := range tl.spread {
				fmt.Fprintf(&table, " %.3f |", x)
			}
			fmt.Fprintf(&table, "\n| %s | floor (round-robin's 95%% interval, median repeat) |", wl.name)
			for _, x := range tl.floor {
				fmt.Fprintf(&table, " %.3f |", x)
			}
			table.WriteString("\n")
		}
	}
	t.Logf("\n%s", table.String())
	if err := os.WriteFile(filepath.Join(outDir, "table.md"), []byte(table.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	type check struct {
		ok   bool
		what string
	}
	var checks []check
	if _, ok := runs["kv-aware"]["shared-prefix"]; ok {
		kvp50, rrp50 := med("kv-aware", "shared-prefix", func(r benchReport) float64 { return r.TTFT["p50"] }),
			med("round-robin", "shared-prefix", func(r benchReport) float64 { return r.TTFT["p50"] })
		checks = append(checks, check{kvp50*3 <= rrp50, fmt.Sprintf("shared-prefix: kv-aware TTFT p50 measured %.1f ms at least 3× lower than round-robin %.1f ms", kvp50, rrp50)})
		p50 := slices.Index(kvPercentiles, 50)
		kvm, rrm := modelled.medians("kv-aware", "shared-prefix")[p50], modelled.medians("round-robin", "shared-prefix")[p50]
		checks = append(checks, check{kvm*3 <= rrm, fmt.Sprintf("shared-prefix: kv-aware TTFT p50 modelled %.1f ms at least 3× lower than round-robin %.1f ms", kvm, rrm)})
	}
	// Acceptance 1 of issue 37, per workload: every percentile within
	// round-robin's own spread, p50 and p90 at most 0.8× round-robin's,
	// the hit ratio at least 0.95 of one big cache's, the busiest worker
	// at most 1.15× its fair share. Each TTFT check is made on the
	// measured figures and, beside it, on the modelled ones: the verdict
	// a shared box's load cannot move.
	for _, wl := range workloads {
		for k, q := range kvPercentiles {
			for _, kind := range kinds {
				kvp, rrp, tl := kind.r.medians("kv-aware", wl.name), kind.r.medians("round-robin", wl.name), tol[kind.name][wl.name]
				checks = append(checks, check{kvp[k] <= rrp[k]*(1+tl.eps[k]),
					fmt.Sprintf("%s: kv-aware TTFT p%g %s %.1f ms (%.3f×) ≤ round-robin %.1f ms × (1+ε %.3f: spread %.3f, floor %.3f)",
						wl.name, q, kind.name, kvp[k], kvp[k]/rrp[k], rrp[k], tl.eps[k], tl.spread[k], tl.floor[k])})
			}
			if q != 50 && q != 90 {
				continue
			}
			for _, kind := range kinds {
				// Beside it, reported, not a change of the check: one big
				// cache (all the blocks, a quarter of the compute, so its
				// TTFT is no bound for four workers), and kv-aware's own
				// floor: the same percentile of its requests' TTFTs alone on
				// idle engines, given the hits it got. Above the line, no
				// placement or queueing reaches 0.8× without more hits;
				// below it, what is over the line is waiting.
				kvp, rrp := kind.r.medians("kv-aware", wl.name), kind.r.medians("round-robin", wl.name)
				big := kind.r.medians("one big cache", wl.name)[k]
				floor := floors.medians("kv-aware", wl.name)[k]
				reach := "below the line: the rest is waiting"
				if floor > 0.8*rrp[k] {
					reach = "above the line: not reachable without more hits"
				}
				checks = append(checks, check{kvp[k] <= 0.8*rrp[k],
					fmt.Sprintf("%s: kv-aware TTFT p%g %s %.1f ms ≤ 0.8 × round-robin %.1f ms (one big cache %.1f ms = %.2f× round-robin; kv-aware's requests alone on idle engines %.1f ms = %.2f×, %s)",
						wl.name, q, kind.name, kvp[k], rrp[k], big, big/rrp[k], floor, floor/rrp[k], reach)})
			}
		}
		kvh, bigh := med("kv-aware", wl.name, hitRatio), med("one big cache", wl.name, hitRatio)
		checks = append(checks, check{kvh >= 0.95*bigh, fmt.Sprintf("%s: kv-aware hit ratio %.3f at least 0.95 of one big cache's %.3f", wl.name, kvh, bigh)})
		share := med("kv-aware", wl.name, func(r benchReport) float64 { return fairShareRatio(r, workers) })
		checks = append(checks, check{share <= 1.15, fmt.Sprintf("%s: kv-aware's busiest worker at %.2f× its fair share (at most 1.15)", wl.name, share)})
	}
	var verdict strings.Builder
	for _, c := range checks {
		mark := "PASS"
		if !c.ok {
			mark = "FAIL"
			t.Error(c.what)
		}
		fmt.Fprintf(&verdict, "- %s: %s\n", mark, c.what)
	}
	t.Logf("\n%s", verdict.String())
	if err := os.WriteFile(filepath.Join(outDir, "checks.md"), []byte(verdict.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// ttftRepeats holds TTFT samples: fleet label → workload → the sorted
// TTFTs (ms) of each repeat.
type ttftRepeats map[string]map[string][][]float64

func (r ttftRepeats) add(label, wl string, sorted []float64) {
	if r[label] == nil {
		r[label] = map[string][][]float64{}
	}
	r[label][wl] = append(r[label][wl], sorted)
}

// medians returns, at each of kvPercentiles, the median over the repeats
// of that percentile.
func (r ttftRepeats) medians(label, wl string) []float64 {
	out := make([]float64, len(kvPercentiles))
	for k, q := range kvPercentiles {
		var v []float64
		for _, sorted := range r[label][wl] {
			v = append(v, bench.Percentile(sorted, q))
		}
		out[k] = median(v)
	}
	return out
}

// median of v (0 for none).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// kvPolicies are the compared fleets, as labelled in reports and tables.
var kvPolicies = []string{"kv-aware", "round-robin", "least-load", "one big cache"}

// kvPercentiles are the TTFT percentiles compared (issue 11).
var kvPercentiles = []float64{10, 25, 50, 75, 90, 99}

// ttftSamples reads a bench report and returns its TTFTs in order, from
// the report's CDF, which must hold every sample (percentiles of them are
// what `infera bench` computes, bench.Percentile).
func ttftSamples(t *testing.T, path string) []float64 {
	t.Helper()
	rep, err := bench.ReadReportFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sorted := make([]float64, len(rep.TTFTCDF))
	for i, p := range rep.TTFTCDF {
		sorted[i] = p[0]
	}
	if n := len(sorted); n == 0 || rep.TTFTCDF[n-1][1] != 1 || float64(n) != math.Round(1/rep.TTFTCDF[0][1]) {
		t.Fatalf("%s: the TTFT CDF does not hold every sample (%d points)", path, n)
	}
	return sorted
}
