package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 5, acceptance 1: four simulated workers under `infera bench` at 64
// concurrency while one worker's engine is SIGKILLed, one worker is SIGTERMed
// (drain) and one engine hangs before its first token on every request.

const (
	chaosConcurrency = 64
	chaosTTFT        = 2 * time.Second
	chaosIdle        = 3 * time.Second
)

// chaosFleet is serve plus four workers: killed (its engine gets SIGKILL),
// drained (SIGTERM), hung (never sends a first token) and healthy.
type chaosFleet struct {
	*fleet
	killed, drained, hung, healthy string
	procs                          map[string]*proc
}

func startChaosFleet(t *testing.T, serveArgs ...string) *chaosFleet {
	t.Helper()
	f := startServe(t, append([]string{"--log-level", "info",
		"--request-max-retries", "2",
		"--ttft-timeout", chaosTTFT.String(),
		"--stream-idle-timeout", chaosIdle.String()}, serveArgs...)...)
	// The engines run in real time (--time-scale 1) so that requests are in
	// flight when the faults strike, but with a fast prefill: the default
	// 10k tokens/s would make one worker's queue at 64 concurrency longer
	// than the first-byte timeout, and healthy workers would time out.
	// One at a time: a worker picks free ports for its engine, and workers
	// starting together can pick the same one.
	names := []string{"killed", "drained", "hung", "healthy"}
	cf := &chaosFleet{fleet: f, procs: map[string]*proc{}}
	ids := make([]string, len(names))
	for i, name := range names {
		args := []string{"--time-scale", "1", "--prefill-tokens-per-s", "1000000"}
		if name == "hung" {
			args = append(args, "--hang-before-first-token", "1")
		}
		var p *proc
		p, ids[i] = f.startWorker("worker-"+name, args...)
		cf.procs[ids[i]] = p
	}
	cf.killed, cf.drained, cf.hung, cf.healthy = ids[0], ids[1], ids[2], ids[3]
	f.waitWorkers("four active workers", 15*time.Second, func(w map[string]string) bool {
		for _, id := range ids {
			if w[id] != "active" {
				return false
			}
		}
		return true
	})
	return cf
}

// waitLoad waits until the worker's engine has a request in flight.
func (cf *chaosFleet) waitLoad(t *testing.T, id string, timeout time.Duration) float64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if n, err := engineLoad(id); err == nil && n > 0 {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("worker %s got no load within %v", id, timeout)
	return 0
}

// killEngine SIGKILLs the killed worker's engine and returns its load (running
// plus waiting requests) read just before: the most streams the kill can break.
func (cf *chaosFleet) killEngine(t *testing.T) (float64, time.Time) {
	t.Helper()
	pid := enginePID(t, cf.procs[cf.killed])
	load, err := engineLoad(cf.killed)
	if err != nil {
		t.Fatalf("read the load of %s: %v", cf.killed, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill engine %d: %v", pid, err)
	}
	return load, time.Now()
}

// drain SIGTERMs the drained worker once it has load, and checks later (in
// checkDrained) that it finished its requests and exited 0.
func (cf *chaosFleet) drain(t *testing.T) {
	t.Helper()
	cf.waitLoad(t, cf.drained, 10*time.Second)
	cf.procs[cf.drained].signal(syscall.SIGTERM)
}

func (cf *chaosFleet) checkDrained(t *testing.T) {
	t.Helper()
	if err := cf.procs[cf.drained].wait(40 * time.Second); err != nil {
		t.Errorf("drained worker exited with %v, want 0; log:\n%s", err, cf.procs[cf.drained].logText())
	}
	if err := cf.procs[cf.killed].wait(10 * time.Second); err == nil {
		t.Errorf("worker whose engine was killed exited 0, want non-zero")
	}
}

// checkRetried asserts the faults were really met: the router retried.
func (cf *chaosFleet) checkRetried(t *testing.T) {
	t.Helper()
	res, err := do(t.Context(), http.MethodGet, cf.base+"/metrics", nil, nil)
	if err != nil || res.status != http.StatusOK {
		t.Errorf("GET /metrics: %v %d", err, res.status)
		return
	}
	text := string(res.body)
	if n := metricValue(text, "infera_router_retries_total"); n == 0 {
		t.Errorf("infera_router_retries_total is 0: the faults were not met by the load")
	}
	if n := metricValue(text, "infera_router_timeouts_total"); n == 0 {
		t.Errorf("infera_router_timeouts_total is 0: no first-byte timeout on the hung engine")
	}
}

func chaosBenchArgs(base string, stream bool) []string {
	return []string{"--url", base, "--model", "sim-model",
		"--requests", "0", "--duration", "10s", "--concurrency", fmt.Sprint(chaosConcurrency),
		"--input-len", "32", "--output-len", "24", fmt.Sprintf("--stream=%t", stream),
		// A hang must show as a bench that does not end, not as a timeout error.
		"--timeout", "5m"}
}

// TestChaosUnary: unary requests at 64 concurrency meet a killed engine, a
// draining worker and a hung engine; no client sees a failure.
func TestChaosUnary(t *testing.T) {
	cf := startChaosFleet(t)
	b := startBench(t, chaosBenchArgs(cf.base, false)...)
	// pacing: the faults strike a steady load, after the hung engine's
	// first requests have timed out.
	time.Sleep(2 * time.Second)
	cf.waitLoad(t, cf.killed, 15*time.Second)
	cf.killEngine(t)
	cf.drain(t)

	rep, out, err := b.wait(t, 90*time.Second)
	if err != nil || len(rep.Errors) != 0 {
		t.Errorf("bench: %v; errors %v; output:\n%s", err, rep.Errors, out)
	}
	if rep.Requests < chaosConcurrency {
		t.Errorf("only %d requests in the run", rep.Requests)
	}
	if rep.PerWorker[cf.healthy] == 0 {
		t.Errorf("the healthy worker served nothing: per_worker %v", rep.PerWorker)
	}
	if n := rep.PerWorker[cf.hung]; n != 0 {
		t.Errorf("%d answers are attributed to the hung engine %s, which never answers: per_worker %v", n, cf.hung, rep.PerWorker)
	}
	cf.checkRetried(t)
	cf.checkDrained(t)
	t.Logf("unary chaos: %d requests in %.1fs, per worker %v", rep.Requests, rep.DurationS, rep.PerWorker)
}

// TestChaosStreaming: the same faults under streaming load, with stream
// continuation off (--migration-limit 0). Only streams that had started on
// the killed engine fail, each with an in-stream error event soon after the
// kill; the others complete; nothing hangs. (With continuation on, see
// TestChaosStreamingContinued: none fails.)
func TestChaosStreaming(t *testing.T) {
	cf := startChaosFleet(t, "--migration-limit", "0")
	b := startBench(t, chaosBenchArgs(cf.base, true)...)
	time.Sleep(2 * time.Second) // pacing, as in TestChaosUnary
	cf.waitLoad(t, cf.killed, 15*time.Second)

	// Long probe streams of our own, all started before the kill, show how
	// each stream ends; the bench shows the totals.
	const probes = 12
	type probe struct {
		worker string
		out    streamOutcome
	}
	results := make(chan probe, probes)
	startedAll := make([]chan struct{}, probes)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range probes {
		startedAll[i] = make(chan struct{})
		go func(i int) {
			out := probeStream(ctx, cf.base, fmt.Sprintf("probe %d tell a long story", i), 1000, startedAll[i])
			results <- probe{worker: out.worker, out: out}
		}(i)
	}
	for i, ch := range startedAll {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("probe stream %d did not start", i)
		}
	}

	load, killedAt := cf.killEngine(t)
	cf.drain(t)

	rep, out, err := b.wait(t, 90*time.Second)
	var failed []string
	for kind, n := range rep.Errors {
		if kind != "stream_error" {
			failed = append(failed, fmt.Sprintf("%s=%d", kind, n))
		}
	}
	if len(failed) > 0 {
		t.Errorf("bench errors other than in-stream failures: %v (all: %v); output:\n%s", failed, rep.Errors, out)
	}
	if n := rep.Errors["stream_error"]; float64(n) > load+2 {
		t.Errorf("%d streams failed, more than the %v requests in flight on the killed engine; output:\n%s", n, load, out)
	}
	if strings.Contains(out, "stream ended without [DONE]") {
		t.Errorf("a stream ended without an error event; output:\n%s", out)
	}
	if err != nil && len(rep.Errors) == 0 {
		t.Errorf("bench exited with %v and no errors; output:\n%s", err, out)
	}

	onKilled := 0
	for range probes {
		var p probe
		select {
		case p = <-results:
		case <-time.After(90 * time.Second):
			t.Fatal("a probe stream hung")
		}
		o := p.out
		switch {
		case o.err != nil || o.status != http.StatusOK:
			t.Errorf("probe on %s: status %d transport error %v", p.worker, o.status, o.err)
		case o.done && o.errorEvent == "":
			if p.worker == cf.killed {
				t.Errorf("probe attributed to the killed engine %s completed", cf.killed)
			}
		case o.errorEvent != "" && !o.done:
			onKilled++
			if p.worker != cf.killed && p.worker != cf.hung {
				t.Errorf("probe on %s (not the killed engine) failed: %s", p.worker, o.errorEvent)
			}
			if late := o.end.Sub(killedAt); late > chaosIdle+2*time.Second {
				t.Errorf("probe ended %v after the kill, later than the idle timeout %v", late, chaosIdle)
			}
		default:
			t.Errorf("probe on %s ended without [DONE] nor a single error event: done=%t error=%q chunks=%d", p.worker, o.done, o.errorEvent, o.chunks)
		}
	}
	cf.checkRetried(t)
	cf.checkDrained(t)
	t.Logf("streaming chaos: %d requests, errors %v, %v in flight on the killed engine, %d of %d probes broken by the kill, per worker %v",
		rep.Requests, rep.Errors, load, onKilled, probes, rep.PerWorker)
}
