package e2e

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Issue 30, acceptance 1: streams that survive their engine. Four simulated
// workers stream under `infera bench` at 32 concurrency for 60 s while an
// engine is SIGKILLed (and its worker restarted) every 10 s and one worker
// is drained (SIGTERM, a short --drain-timeout: streams still running then
// are cut) and restarted. With --migration-limit on, no stream fails: each
// broken one is continued on another worker, and long probe streams read
// exactly the text of the same request run without faults (the simulator's
// text is a function of the prompt and the tokens before).

const (
	contRun       = 60 * time.Second
	contKillEvery = 10 * time.Second
	contProbes    = 8
	contProbeLen  = 400
)

// contSimArgs: real time, fast prefill, slow enough decode that streams are
// mid-way when the faults strike.
var contSimArgs = []string{"--time-scale", "1", "--prefill-tokens-per-s", "1000000", "--decode-ms-per-token", "2"}

func TestChaosStreamingContinued(t *testing.T) {
	f := startServe(t, "--log-level", "info", "--request-max-retries", "2",
		"--ttft-timeout", "3s", "--stream-idle-timeout", "3s", "--migration-limit", "3")
	logServeOnFailure(t, f)
	type member struct {
		name string
		p    *proc
		id   string
	}
	var (
		mu      sync.Mutex
		members = map[string]*member{}
		starts  int
	)
	startMember := func(name string) *member {
		starts++
		p, id := f.startWorkerFlags(fmt.Sprintf("worker-%s-%d", name, starts), []string{"--drain-timeout", "2s"}, contSimArgs...)
		m := &member{name: name, p: p, id: id}
		mu.Lock()
		members[name] = m
		mu.Unlock()
		return m
	}
	for _, name := range []string{"a", "b", "c", "d"} {
		startMember(name)
	}
	f.waitWorkers("four active workers", 30*time.Second, func(w map[string]string) bool {
		n := 0
		for _, s := range w {
			if s == "active" {
				n++
			}
		}
		return n == 4
	})

	want := probeTexts(t, f.base, contProbeLen) // without faults

	b := startBench(t, "--url", f.base, "--model", "sim-model", "--requests", "0",
		"--duration", contRun.String(), "--concurrency", "32", "--input-len", "32", "--output-len", "48",
		"--stream=true", "--timeout", "5m")

	// Probe rounds: long streams started before each fault, read to their
	// end.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	probes := newProbeRounds(t, ctx, f.base, contProbeLen)

	// The faults: a kill every contKillEvery (victims in turn: a, b, c),
	// the drain of d after the second kill.
	victims := []string{"a", "b", "c"}
	end := time.Now().Add(contRun - 5*time.Second)
	for round := 0; time.Now().Before(end); round++ {
		time.Sleep(contKillEvery / 2)
		probes.start(round)
		mu.Lock()
		v := members[victims[round%len(victims)]]
		mu.Unlock()
		if err := syscall.Kill(enginePID(t, v.p), syscall.SIGKILL); err != nil {
			t.Fatalf("kill the engine of %s: %v", v.name, err)
		}
		if err := v.p.wait(20 * time.Second); err == nil {
			t.Errorf("worker %s exited 0 after its engine was killed", v.name)
		}
		startMember(v.name)
		if round == 1 {
			probes.start(100 + round)
			mu.Lock()
			d := members["d"]
			mu.Unlock()
			d.p.signal(syscall.SIGTERM)
			if err := d.p.wait(40 * time.Second); err != nil {
				t.Errorf("drained worker exited with %v, want 0", err)
			}
			startMember("d")
		}
		time.Sleep(contKillEvery / 2)
	}

	rep, out, err := b.wait(t, 2*contRun)
	if err != nil || len(rep.Errors) != 0 {
		t.Errorf("bench: %v; failed streams %v, want none; output:\n%s", err, rep.Errors, out)
	}
	n := probes.check(want)
	metrics := scrape(t, f.base+"/metrics")
	broken := metricValue(metrics, "infera_migrations_total", `reason="stream_broken"`)
	draining := metricValue(metrics, "infera_migrations_total", `reason="worker_draining"`)
	failed := metricValue(metrics, "infera_migrations_failed_total")
	if broken == 0 || draining == 0 || failed != 0 {
		t.Errorf("migrations: %v broken, %v draining, %v failed; want some of both and none failed", broken, draining, failed)
	}
	t.Logf("continued chaos: %d requests, %d probes, migrations %v (stream_broken) + %v (worker_draining), per worker %v",
		rep.Requests, n, broken, draining, rep.PerWorker)
}

// probeTexts streams every probe once (maxTokens long) and returns the
// texts read.
func probeTexts(t *testing.T, base string, maxTokens int) []string {
	t.Helper()
	want := make([]string, contProbes)
	for i := range want {
		o := probeStream(t.Context(), base, probePrompt(i), maxTokens, nil)
		// The request id is what a failed probe is found by in serve's
		// log (logServeOnFailure).
		if o.err != nil || !o.done || o.errorEvent != "" || o.requestID == "" {
			t.Fatalf("reference probe %d: %+v", i, o)
		}
		want[i] = o.text
	}
	return want
}

// probeRounds runs rounds of contProbes long probe streams against a
// fleet under faults, and checks each against the text of the same
// request run without them (probeTexts).
type probeRounds struct {
	t         *testing.T
	ctx       context.Context
	base      string
	maxTokens int
	wg        sync.WaitGroup
	mu        sync.Mutex
	results   []probeResult
}

// probeResult is probe i of a round, as it ended.
type probeResult struct {
	round, i int
	out      streamOutcome
}

func newProbeRounds(t *testing.T, ctx context.Context, base string, maxTokens int) *probeRounds {
	return &probeRounds{t: t, ctx: ctx, base: base, maxTokens: maxTokens}
}

// start starts the probes of one round and returns when each has started
// (or 30 s went by: an error), so that some run on the victim of the fault
// that follows.
func (p *probeRounds) start(round int) {
	started := make([]chan struct{}, contProbes)
	for i := range contProbes {
		started[i] = make(chan struct{})
		p.wg.Go(func() {
			o := probeStream(p.ctx, p.base, probePrompt(i), p.maxTokens, started[i])
			p.mu.Lock()
			p.results = append(p.results, probeResult{round, i, o})
			p.mu.Unlock()
		})
	}
	for _, ch := range started {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			p.t.Errorf("round %d: a probe stream did not start", round)
		}
	}
}

// check waits for every probe to end, reports each that failed or read
// other text than want[i], and returns how many ran.
func (p *probeRounds) check(want []string) int {
	p.t.Helper()
	p.wg.Wait()
	for _, r := range p.results {
		o := r.out
		if o.err != nil || !o.done || o.errorEvent != "" {
			p.t.Errorf("probe %d of round %d (worker %s, request %s) failed: done=%t error=%q transport=%v", r.i, r.round, o.worker, o.requestID, o.done, o.errorEvent, o.err)
			continue
		}
		if o.text != want[r.i] {
			p.t.Errorf("probe %d of round %d (worker %s, request %s): continued text differs from the unbroken run\n got %q\nwant %q", r.i, r.round, o.worker, o.requestID, o.text, want[r.i])
		}
	}
	return len(p.results)
}

func probePrompt(i int) string {
	return fmt.Sprintf("probe %d: tell a long story about a routed fleet", i)
}

// TestChaosPDStreamingContinued (issue 30, acceptance 2): the same with a
// disaggregated fleet (one prefill and three decode workers, vllm-nixl):
// a decode engine SIGKILLed mid-stream (twice, its worker restarted) fails
// no stream; each broken decode continues on another decode worker, and
// long probes read the unbroken run's text.
func TestChaosPDStreamingContinued(t *testing.T) {
	f := startServe(t, "--log-level", "info", "--request-max-retries", "2",
		"--ttft-timeout", "3s", "--stream-idle-timeout", "3s", "--migration-limit", "3")
	logServeOnFailure(t, f)
	pdArgs := func(role string) []string {
		return append([]string{"--pd-role", role, "--pd-protocol", "vllm-nixl"}, contSimArgs...)
	}
	wflags := []string{"--disaggregation-allow-tcp", "--drain-timeout", "2s"}
	f.startWorkerFlags("pd-prefill", wflags, pdArgs("prefill")...)
	decode := make([]*proc, 3)
	for i := range decode {
		decode[i], _ = f.startWorkerFlags(fmt.Sprintf("pd-decode-%d", i), wflags, pdArgs("decode")...)
	}
	f.waitWorkers("four active PD workers", 30*time.Second, func(w map[string]string) bool { return len(w) == 4 })
	want := probeTexts(t, f.base, contProbeLen) // without faults
	b := startBench(t, "--url", f.base, "--model", "sim-model", "--requests", "0",
		"--duration", "25s", "--concurrency", "16", "--input-len", "32", "--output-len", "48",
		"--stream=true", "--timeout", "5m")
	probes := newProbeRounds(t, t.Context(), f.base, contProbeLen)
	for round := range 2 {
		time.Sleep(4 * time.Second)
		probes.start(round)
		victim := decode[round]
		if err := syscall.Kill(enginePID(t, victim), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := victim.wait(20 * time.Second); err == nil {
			t.Errorf("decode worker %d exited 0 after its engine was killed", round)
		}
		decode[round], _ = f.startWorkerFlags(fmt.Sprintf("pd-decode-%d-again", round), wflags, pdArgs("decode")...)
	}
	rep, out, err := b.wait(t, 2*time.Minute)
	if err != nil || len(rep.Errors) != 0 {
		t.Errorf("bench: %v; failed streams %v, want none; output:\n%s", err, rep.Errors, out)
	}
	probes.check(want)
	metrics := scrape(t, f.base+"/metrics")
	if n := metricValue(metrics, "infera_migrations_total"); n == 0 {
		t.Errorf("no stream was continued: the kills broke nothing")
	}
	if n := metricValue(metrics, "infera_migrations_failed_total"); n != 0 {
		t.Errorf("%v failed migrations", n)
	}
	t.Logf("continued PD chaos: %d requests, migrations %v", rep.Requests, metricValue(metrics, "infera_migrations_total"))
}

// logServeOnFailure logs serve's whole log when the test failed: a lost
// stream under load is explained by the lines around it (which worker
// broke, which continuation was tried), and they are gone after the run.
func logServeOnFailure(t *testing.T, f *fleet) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve log:\n%s", f.serve.logText())
		}
	})
}
