package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

type benchReport struct {
	Requests   int            `json:"requests"`
	Errors     map[string]int `json:"errors"`
	DurationS  float64        `json:"duration_s"`
	Throughput struct {
		ReqPerS       float64 `json:"req_per_s"`
		OutputTokPerS float64 `json:"output_tok_per_s"`
	} `json:"throughput"`
	TTFT          map[string]float64 `json:"ttft_ms"`
	CacheHitRatio *float64           `json:"cache_hit_ratio"`
	PerWorker     map[string]int     `json:"per_worker"`
	// ModelTTFTMs is the simulators' own mean TTFT over the run (their
	// step model, independent of the box's load): filled by runKVFleet.
	ModelTTFTMs float64 `json:"-"`
	// ModelTTFTsMs are the simulators' modelled TTFTs of every request,
	// sorted (their --model-ttft-log lines): filled by runKVFleet when it
	// writes its reports to a directory.
	ModelTTFTsMs []float64 `json:"-"`
	// ModelIdleTTFTsMs are the same requests' TTFTs alone on an idle
	// engine (model_idle_ttft_s), sorted: the floor the fleet's cache hits
	// leave, which no queueing or placement goes under.
	ModelIdleTTFTsMs []float64 `json:"-"`
}

// runBench runs `infera bench` to completion and decodes its --json report.
func runBench(t *testing.T, timeout time.Duration, args ...string) (benchReport, error) {
	t.Helper()
	return runBenchTo(t, timeout, filepath.Join(t.TempDir(), "report.json"), args...)
}

// runBenchTo is runBench writing its --json report to out.
func runBenchTo(t *testing.T, timeout time.Duration, out string, args ...string) (benchReport, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), binary, append([]string{"bench", "--json", out, "--progress=false"}, args...)...)
	cmd.Env = cleanEnv()
	done := make(chan struct{})
	var output []byte
	var runErr error
	go func() {
		output, runErr = cmd.CombinedOutput()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("infera bench %v did not finish within %v", args, timeout)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("infera bench wrote no report (%v): %v\n%s", runErr, err, output)
	}
	var rep benchReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("bad report: %v\n%s", err, data)
	}
	return rep, runErr
}

// TestBenchDirectAndThroughServe: `infera bench` against a simulator directly
// and through `infera serve` produces the JSON report with non-zero
// throughput; against a dead URL it reports errors promptly.
func TestBenchDirectAndThroughServe(t *testing.T) {
	sim := start(t, "sim", "sim", "--port", "0", "--time-scale", "0", "--model", "sim-model")
	simAddr, _ := sim.waitLog("sim listening", 30*time.Second)["addr"].(string)

	f := startServe(t)
	_, id := f.startWorker("worker", "--time-scale", "0")
	f.waitWorkers("the worker", 10*time.Second, func(w map[string]string) bool { return w[id] == "active" })

	for _, target := range []struct{ name, url string }{
		{"direct", "http://" + simAddr},
		{"serve", f.base},
	} {
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/stream=%t", target.name, stream), func(t *testing.T) {
				rep, err := runBench(t, 60*time.Second, "--url", target.url, "--model", "sim-model",
					"--requests", "40", "--concurrency", "4", "--input-len", "32", "--output-len", "8",
					fmt.Sprintf("--stream=%t", stream))
				if err != nil {
					t.Fatalf("bench failed: %v", err)
				}
				if rep.Requests != 40 || len(rep.Errors) != 0 {
					t.Fatalf("requests %d errors %v", rep.Requests, rep.Errors)
				}
				if rep.Throughput.ReqPerS <= 0 || rep.Throughput.OutputTokPerS <= 0 || rep.TTFT["p50"] <= 0 {
					t.Fatalf("empty figures: %+v", rep)
				}
				if target.name == "serve" && rep.PerWorker[id] != 40 {
					t.Fatalf("per_worker %v, want all 40 on %s", rep.PerWorker, id)
				}
			})
		}
	}

	t.Run("dead url", func(t *testing.T) {
		dead := fmt.Sprintf("http://127.0.0.1:%d", testkit.FreePort(t))
		rep, err := runBench(t, 30*time.Second, "--url", dead, "--model", "sim-model", "--requests", "20", "--concurrency", "4")
		if err == nil {
			t.Fatal("bench against a dead URL exited 0")
		}
		total := 0
		for _, n := range rep.Errors {
			total += n
		}
		if total != 20 || rep.Errors["connect"] == 0 {
			t.Fatalf("errors %v, want 20 connect errors", rep.Errors)
		}
	})
}
