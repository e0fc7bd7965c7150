//go:build kvbench

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestKVRoutingComparison is the full measurement behind docs/performance.md
// (make bench-kv): shared-prefix, multi-turn and trace workloads against
// kv-aware, round-robin and least-load, plus one simulator holding the whole
// fleet's cache. It is built only with -tags kvbench and writes the reports, plots
// and the markdown table into INFERA_KV_BENCH_OUT.
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
		{name: "multi-turn", args: []string{"--workload", "multi-turn", "--sessions", "16", "--turns", "5",
			"--input-len", "40", "--output-len", "16", "--concurrency", "8", "--seed", "2"}},
		{name: "trace", args: []string{"--workload", "trace", "--trace", trace, "--trace-limit", "400",
			"--trace-block-words", "8", "--trace-time-scale", "0", "--concurrency", "8", "--seed", "3"}},
	}
	results := map[string]map[string]benchReport{} // fleet label → workload → report
	for _, fl := range []kvFleet{
		{"kv-aware", workers, kvBlocks},
		{"round-robin", workers, kvBlocks},
		{"least-load", workers, kvBlocks},
		{"round-robin", 1, workers * kvBlocks},
	} {
		results[fl.label()] = runKVFleet(t, fl, workloads, outDir)
	}
	// One TTFT CDF plot per workload, every fleet on it.
	for _, wl := range workloads {
		plotArgs := []string{"bench", "plot"}
		for _, label := range []string{"kv-aware", "round-robin", "least-load", "one big cache"} {
			plotArgs = append(plotArgs, filepath.Join(outDir, fmt.Sprintf("%s-%s.json", wl.name, strings.ReplaceAll(label, " ", "-"))))
		}
		plotArgs = append(plotArgs, "-o", filepath.Join(outDir, wl.name+"-ttft-cdf.svg"))
		if out, err := exec.Command(binary, plotArgs...).CombinedOutput(); err != nil {
			t.Errorf("infera %v: %v\n%s", plotArgs, err, out)
		}
	}
	var table strings.Builder
	table.WriteString("| workload | policy | hit ratio | TTFT p50 ms | TTFT p99 ms | req/s | max/fair share |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, wl := range workloads {
		for _, policy := range []string{"kv-aware", "round-robin", "least-load", "one big cache"} {
			r := results[policy][wl.name]
			n := workers
			if policy == "one big cache" {
				n = 1
			}
			fmt.Fprintf(&table, "| %s | %s | %.3f | %.1f | %.1f | %.1f | %.2f |\n", wl.name, policy, hitRatio(r),
				r.TTFT["p50"], r.TTFT["p99"], r.Throughput.ReqPerS, fairShareRatio(r, n))
		}
	}
	t.Logf("\n%s", table.String())
	if err := os.WriteFile(filepath.Join(outDir, "table.md"), []byte(table.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	kv, rr, big := results["kv-aware"]["shared-prefix"], results["round-robin"]["shared-prefix"], results["one big cache"]["shared-prefix"]
	checks := []struct {
		ok   bool
		what string
	}{
		{kv.TTFT["p50"]*3 <= rr.TTFT["p50"], fmt.Sprintf("kv-aware TTFT p50 %.1f ms at least 3× lower than round-robin %.1f ms", kv.TTFT["p50"], rr.TTFT["p50"])},
		{hitRatio(kv) >= 0.9*hitRatio(big), fmt.Sprintf("kv-aware hit ratio %.3f within 10%% of one big cache %.3f", hitRatio(kv), hitRatio(big))},
		{kv.Throughput.ReqPerS >= rr.Throughput.ReqPerS, fmt.Sprintf("kv-aware throughput %.1f req/s not below round-robin %.1f", kv.Throughput.ReqPerS, rr.Throughput.ReqPerS)},
		{fairShareRatio(kv, workers) <= 2, fmt.Sprintf("no worker above 2× its fair share (%.2f)", fairShareRatio(kv, workers))},
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

// traceFixture finds the shared Mooncake trace, or the small sample that the
// bench package ships.
func traceFixture(t *testing.T) string {
	for _, p := range []string{"../../shared/fixtures/traces/mooncake_synthetic_trace.jsonl", "../bench/testdata/trace_sample.jsonl"} {
		if _, err := os.Stat(p); err == nil {
			abs, _ := filepath.Abs(p)
			return abs
		}
	}
	t.Fatal("no trace fixture found")
	return ""
}
