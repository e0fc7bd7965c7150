package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 35, acceptance 4: the divergence alarm. One simulator of four
// tokenizes and renders chats with Qwen3's tokenizer and template while the
// router uses bytes: within 100 requests the router warns once, naming that
// worker, and the fleet page marks it; a matched fleet stays quiet over the
// shared-prefix and trace workloads.

// divergenceFleet starts kv-aware serve (bytes tokenizer) and four precise
// simulators of the sim's default cache (4096 blocks of 16 tokens: the
// trace's working set fits; a cache that thrashes under it makes the
// router's predictions wrong, which the alarm reports too), the first with
// simArgs0 added; it returns the fleet and the worker ids in start order.
func divergenceFleet(t *testing.T, simArgs0 ...string) (*fleet, []string, []*proc) {
	t.Helper()
	f := startServe(t, "--router-policy", "kv-aware", "--tokenizer", "bytes")
	ids := map[string]bool{}
	var order []string
	var procs []*proc
	for i := range 4 {
		args := []string{"--time-scale", "0", "--max-model-len", "6400"}
		if i == 0 {
			args = append(args, simArgs0...)
		}
		p, id := f.startWorker(fmt.Sprintf("div-worker-%d", i), args...)
		ids[id] = true
		order = append(order, id)
		procs = append(procs, p)
	}
	f.waitWorkers("all workers", 30*time.Second, func(w map[string]string) bool {
		for id := range ids {
			if w[id] != "active" {
				return false
			}
		}
		return true
	})
	f.waitPrecise(ids, 30*time.Second)
	return f, order, procs
}

func divergenceWarnings(f *fleet) []map[string]any {
	f.serve.mu.Lock()
	defer f.serve.mu.Unlock()
	var out []map[string]any
	for _, l := range f.serve.lines {
		if m, _ := l["message"].(string); strings.HasPrefix(m, "kv divergence") {
			out = append(out, l)
		}
	}
	return out
}

func TestKVDivergenceAlarmE2E(t *testing.T) {
	t.Run("mismatched tokenizer", func(t *testing.T) {
		qwen, err := filepath.Abs(filepath.Join("..", "testdata", "tokenizers", "qwen3"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(qwen, "tokenizer.json")); err != nil {
			if os.Getenv("INFERA_SKIP_TOKENIZER_PARITY") == "1" {
				t.Skip("qwen3 tokenizer files missing and INFERA_SKIP_TOKENIZER_PARITY=1")
			}
			t.Fatalf("qwen3 tokenizer files missing in %s: run make tokenizers", qwen)
		}
		f, ids, procs := divergenceFleet(t, "--tokenizer", qwen)
		odd := ids[0]
		if _, err := runBench(t, 5*time.Minute, "--url", f.base, "--model", "sim-model", "--workload", "shared-prefix",
			"--prefix-groups", "8", "--prefix-len", "150", "--suffix-len", "10", "--output-len", "4",
			"--requests", "100", "--concurrency", "4", "--seed", "1"); err != nil {
			t.Fatal(err)
		}
		warns := divergenceWarnings(f)
		if len(warns) != 1 || warns[0]["worker_id"] != odd || warns[0]["likely_cause"] == "" || warns[0]["cause"] != "prompt_tokens" {
			t.Fatalf("want one warning naming %s, got %v", odd, warns)
		}
		t.Logf("warning: %v", warns[0])
		snap := fleetJSON(t, f.base)
		for _, w := range snap.Workers {
			d := w.Divergence
			if d == nil {
				t.Fatalf("worker %s has no divergence state", w.WorkerID)
			}
			if (w.WorkerID == odd) != d.Divergent {
				t.Fatalf("worker %s (mismatched %v): divergence %+v", w.WorkerID, w.WorkerID == odd, d)
			}
		}
		if v := metricValue(scrapeText(t, f.base+"/metrics"), "infera_router_kv_divergent", `worker_id="`+odd+`"`); v != 1 {
			t.Fatalf("infera_router_kv_divergent of %s = %v", odd, v)
		}
		// The fleet page marks it (amber), and only it.
		b := startBrowser(t, f.base+"/dashboard")
		b.waitEval("the divergent worker marked", rowJS(odd, `tr.className == "warn" && tr.querySelector(".diverged") != null`), 20*time.Second)
		var marked int
		b.eval(`document.querySelectorAll("#workers .diverged").length`, &marked)
		if marked != 1 {
			t.Fatalf("%d workers marked diverged on the page, want 1", marked)
		}
		for _, p := range procs {
			p.stop(syscall.SIGTERM)
		}
	})
	t.Run("matched fleet", func(t *testing.T) {
		f, _, procs := divergenceFleet(t)
		for _, wl := range []kvWorkload{
			sharedPrefix(200),
			{name: "trace", args: []string{"--workload", "trace", "--trace", traceFixture(t), "--trace-block-words", "8",
				"--trace-time-scale", "0", "--concurrency", "8", "--seed", "3"}},
		} {
			if _, err := runBench(t, 10*time.Minute, append([]string{"--url", f.base, "--model", "sim-model"}, wl.args...)...); err != nil {
				t.Fatalf("%s: %v", wl.name, err)
			}
			if w := divergenceWarnings(f); len(w) != 0 {
				t.Fatalf("%s: matched fleet warned: %v", wl.name, w)
			}
		}
		observed := 0
		for _, w := range fleetJSON(t, f.base).Workers {
			if d := w.Divergence; d != nil {
				observed++
				if d.Divergent || d.PromptsDiffering != 0 {
					t.Fatalf("matched worker %s: %+v", w.WorkerID, d)
				}
			}
		}
		if observed == 0 {
			t.Fatal("no worker's usage was observed")
		}
		for _, p := range procs {
			p.stop(syscall.SIGTERM)
		}
	})
}
