package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// kvFleet describes one measured fleet: a policy in front of N simulated
// workers whose caches each hold kvBlocks blocks.
type kvFleet struct {
	policy   string
	workers  int
	kvBlocks int
	// serveArgs are extra `infera serve` flags (tuning runs of make bench-kv).
	serveArgs []string
}

// kvWorkload is one `infera bench` invocation (without URL and output).
type kvWorkload struct {
	name string
	args []string
}

// simTiming makes prefill dominate TTFT, as on a GPU with long prompts, so
// that a cache hit is visible in TTFT.
var simTiming = []string{"--time-scale", "1", "--prefill-tokens-per-s", "20000", "--step-overhead-ms", "2",
	"--decode-ms-per-token", "0.2", "--max-model-len", "6400"}

// runKVFleet runs every workload on its own fresh fleet of the given
// policy and workers (serve, its embedded etcd and every simulator started
// anew) and returns the reports by workload name. A fleet shared by the
// workloads carried the previous workload's picks and caches into the
// next one's figures (issue 37, h3b: the conversation workload's busiest
// worker at 1.20× fair came from multi-turn's 780 picks before it); a
// fresh fleet costs a few seconds of start, against minutes of workload.
func runKVFleet(t *testing.T, fl kvFleet, workloads []kvWorkload, outDir string) map[string]benchReport {
	t.Helper()
	if outDir != "" {
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string]benchReport{}
	for _, wl := range workloads {
		out[wl.name] = runKVWorkload(t, fl, wl, outDir)
	}
	return out
}

// runKVWorkload starts a fleet, checks that nothing has been picked or
// served on it yet, runs one workload against it and stops it.
func runKVWorkload(t *testing.T, fl kvFleet, wl kvWorkload, outDir string) benchReport {
	t.Helper()
	f := startServe(t, append([]string{"--router-policy", fl.policy, "--tokenizer", "bytes"}, fl.serveArgs...)...)
	ids := map[string]bool{}
	var procs []*proc
	var urls []string
	// With a report directory every simulator logs each request's
	// modelled TTFT (--model-ttft-log), read back once they stopped.
	var ttftLogs []string
	for i := 0; i < fl.workers; i++ {
		args := append([]string{"--kv-blocks", fmt.Sprint(fl.kvBlocks)}, simTiming...)
		if outDir != "" {
			log := filepath.Join(outDir, fmt.Sprintf("%s-%s-w%d-model-ttft.jsonl", wl.name, strings.ReplaceAll(fl.label(), " ", "-"), i))
			ttftLogs = append(ttftLogs, log)
			args = append(args, "--model-ttft-log", log)
		}
		p, id, url := f.startWorkerURL(fmt.Sprintf("%s-worker-%d", fl.policy, i), args...)
		procs = append(procs, p)
		urls = append(urls, url)
		ids[id] = true
	}
	// The simulators' modelled TTFT: the sum over workers of their model's
	// TTFT and first tokens (infera_sim_model_ttft_seconds_total,
	// infera_sim_first_tokens_total).
	modelled := func() (sec, n float64) {
		for _, u := range urls {
			text := scrapeText(t, u+"/metrics")
			sec += metricValue(text, "infera_sim_model_ttft_seconds_total")
			n += metricValue(text, "infera_sim_first_tokens_total")
		}
		return sec, n
	}
	f.waitWorkers("all workers", 20*time.Second, func(w map[string]string) bool {
		for id := range ids {
			if w[id] != "active" {
				return false
			}
		}
		return true
	})
	if fl.policy == "kv-aware" {
		f.waitPrecise(ids, 20*time.Second)
	}
	// The workload's figures are its own only if the fleet starts empty:
	// no pick in the router's counts, no first token on any simulator.
	routerText := scrapeText(t, f.base+"/metrics")
	if routerText == "" {
		t.Fatalf("%s on %s: the router's /metrics could not be read to check that the fleet is fresh", wl.name, fl.label())
	}
	if picks := metricValue(routerText, "infera_router_picks_total"); picks != 0 {
		t.Fatalf("%s on %s: the router has %v picks before the workload starts: state carried over", wl.name, fl.label(), picks)
	}
	sec0, n0 := modelled()
	if n0 != 0 {
		t.Fatalf("%s on %s: the simulators served %v first tokens before the workload starts: state carried over", wl.name, fl.label(), n0)
	}
	args := append([]string{"--url", f.base, "--model", "sim-model", "--label", fl.label()}, wl.args...)
	report := filepath.Join(t.TempDir(), "report.json")
	if outDir != "" {
		report = filepath.Join(outDir, fmt.Sprintf("%s-%s.json", wl.name, strings.ReplaceAll(fl.label(), " ", "-")))
	}
	rep, err := runBenchTo(t, 15*time.Minute, report, args...)
	if err != nil {
		t.Fatalf("%s on %s: %v", wl.name, fl.policy, err)
	}
	// The time kv-aware held requests before sending them
	// (--kv-coalesce-wait) is part of their TTFT that no simulator sees:
	// it is added to their modelled TTFT.
	holds, held := coalesceHolds(f.serve)
	firsts := 0.0
	if sec, n := modelled(); n > n0 {
		rep.ModelTTFTMs = 1e3 * (sec - sec0 + held) / (n - n0)
		firsts = n - n0
	}
	for _, p := range procs {
		p.stop(syscall.SIGTERM)
	}
	if len(ttftLogs) > 0 {
		// Written at shutdown: read after every simulator stopped.
		rep.ModelTTFTsMs, rep.ModelIdleTTFTsMs = readModelTTFTs(t, ttftLogs, holds)
		if float64(len(rep.ModelTTFTsMs)) != firsts {
			t.Errorf("%s on %s: %d modelled TTFTs logged, the simulators counted %v first tokens", wl.name, fl.label(), len(rep.ModelTTFTsMs), firsts)
		}
	}
	f.serve.stop(syscall.SIGTERM)
	if outDir != "" && fl.policy == "kv-aware" {
		// The router's log (debug level: one "kv pick" line per pick of
		// --kv-cost ttft and one "kv answer" per answer) for pick analyses,
		// one per workload now that each has its own router.
		f.serve.mu.Lock()
		raw := strings.Join(f.serve.raw, "\n")
		f.serve.mu.Unlock()
		if err := os.WriteFile(filepath.Join(outDir, wl.name+"-kv-aware-serve.log"), []byte(raw), 0o644); err != nil {
			t.Errorf("write serve log: %v", err)
		}
	}
	return rep
}

// coalesceHolds returns the seconds the router held each request
// ("kv coalesce hold" debug lines, by request id) and their sum.
func coalesceHolds(serve *proc) (map[string]float64, float64) {
	serve.mu.Lock()
	defer serve.mu.Unlock()
	holds, sum := map[string]float64{}, 0.0
	for _, line := range serve.raw {
		if !strings.Contains(line, `"kv coalesce hold"`) {
			continue
		}
		var l struct {
			ID   string  `json:"request_id"`
			Held float64 `json:"hold_seconds"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.ID != "" {
			holds[l.ID] += l.Held
			sum += l.Held
		}
	}
	return holds, sum
}

// readModelTTFTs returns the model_ttft_s and the model_idle_ttft_s of
// every line of the simulators' --model-ttft-log files, in milliseconds,
// each sorted; a request's hold in the router (holds, seconds by request
// id) is added to its TTFT, not to its idle one.
func readModelTTFTs(t *testing.T, paths []string, holds map[string]float64) (ttfts, idles []float64) {
	t.Helper()
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("model ttft log: %v", err)
		}
		for line := range bytes.Lines(b) {
			var l struct {
				ID   string   `json:"request_id"`
				TTFT *float64 `json:"model_ttft_s"`
				Idle *float64 `json:"model_idle_ttft_s"`
			}
			if err := json.Unmarshal(line, &l); err != nil || l.TTFT == nil || l.Idle == nil {
				t.Fatalf("%s: line %q: no model_ttft_s or model_idle_ttft_s (%v)", path, line, err)
			}
			ttfts = append(ttfts, (*l.TTFT+holds[l.ID])*1e3)
			idles = append(idles, *l.Idle*1e3)
		}
	}
	slices.Sort(ttfts)
	slices.Sort(idles)
	return ttfts, idles
}

// scrapeText GETs a Prometheus exposition ("" on failure: a missing
// figure, not a failed comparison).
func scrapeText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Logf("GET %s: %v", url, err)
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// label names the fleet in tables and plots.
func (fl kvFleet) label() string {
	if fl.workers == 1 {
		return "one big cache"
	}
	return fl.policy
}

// waitPrecise waits until the server's cache view says every worker's KV-event
// stream is live, so that a comparison does not start in approximate mode.
func (f *fleet) waitPrecise(ids map[string]bool, timeout time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		all := true
		for id := range ids {
			view, err := f.cacheView(id)
			if err != nil || view.Mode != "precise" {
				all = false
				break
			}
		}
		if all {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.t.Fatalf("workers did not reach precise mode within %v", timeout)
}

// sharedPrefix is the acceptance workload: 16 groups whose shared prefixes
// together need about 2.5× one worker's cache.
func sharedPrefix(requests int) kvWorkload {
	return kvWorkload{name: "shared-prefix", args: []string{"--workload", "shared-prefix", "--prefix-groups", "16",
		"--prefix-len", "150", "--suffix-len", "10", "--output-len", "8", "--requests", fmt.Sprint(requests),
		"--concurrency", "8", "--seed", "1"}}
}

// fairShareRatio is the largest per-worker count over the fair share.
func fairShareRatio(rep benchReport, workers int) float64 {
	total, most := 0, 0
	for _, n := range rep.PerWorker {
		total += n
		most = max(most, n)
	}
	if total == 0 {
		return math.Inf(1)
	}
	return float64(most) / (float64(total) / float64(workers))
}

func hitRatio(rep benchReport) float64 {
	if rep.CacheHitRatio == nil {
		return 0
	}
	return *rep.CacheHitRatio
}

// TestKVAwareRoutingHitsCache is the CI-sized check of cache-aware routing on
// real processes: with four workers whose caches cannot each hold the shared
// prefixes, kv-aware keeps each group on a worker that caches it, under each
// cost mode (--kv-cost blocks and ttft, subtests cost=<mode>). Only cache
// hit ratios and request spread are asserted — they do not depend on timing.
func TestKVAwareRoutingHitsCache(t *testing.T) {
	const workers, kvBlocks = 4, 400
	wl := []kvWorkload{sharedPrefix(192)}
	rr := runKVFleet(t, kvFleet{policy: "round-robin", workers: workers, kvBlocks: kvBlocks}, wl, "")["shared-prefix"]
	oracle := runKVFleet(t, kvFleet{policy: "round-robin", workers: 1, kvBlocks: workers * kvBlocks}, wl, "")["shared-prefix"]
	for _, cost := range []string{"blocks", "ttft"} {
		t.Run("cost="+cost, func(t *testing.T) {
			kv := runKVFleet(t, kvFleet{policy: "kv-aware", workers: workers, kvBlocks: kvBlocks,
				serveArgs: []string{"--kv-cost", cost}}, wl, "")["shared-prefix"]
			t.Logf("hit ratio: kv-aware %.3f, round-robin %.3f, one big cache %.3f; kv-aware spread %v",
				hitRatio(kv), hitRatio(rr), hitRatio(oracle), kv.PerWorker)
			if hitRatio(kv) < hitRatio(rr)+0.2 {
				t.Errorf("kv-aware hit ratio %.3f is not clearly above round-robin's %.3f", hitRatio(kv), hitRatio(rr))
			}
			if hitRatio(kv) < 0.9*hitRatio(oracle) {
				t.Errorf("kv-aware hit ratio %.3f is not within 10%% of one cache holding everything (%.3f)", hitRatio(kv), hitRatio(oracle))
			}
			if r := fairShareRatio(kv, workers); r > 2 {
				t.Errorf("a worker got %.2f× its fair share (%v)", r, kv.PerWorker)
			}
		})
	}
}

// traceFixture is a sample of the synthetic Mooncake trace of
// ../shared/fixtures/traces/mooncake_synthetic_trace.jsonl: every record
// whose first hash id is 1 mod 8 (one prefix family in eight, all of its
// records, in trace order), lines copied verbatim into testdata (see
// testdata/README.md) so that a fresh clone runs the same benchmark. A
// contiguous slice of a few hundred records reuses almost nothing within
// reach of the fleet's cache; sampling whole families keeps the trace's
// reuse at a working set the fleet can hold.
func traceFixture(t *testing.T) string {
	abs, err := filepath.Abs(filepath.Join("testdata", "mooncake_synthetic_trace_sampled.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("trace fixture: %v", err)
	}
	return abs
}
