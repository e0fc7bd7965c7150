package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/natstest"
)

// Issue 33, acceptance 5: drain over NATS under streaming load. Serve and
// three sim workers take their requests over NATS with JetStream admission
// (--nats-req-max-pending) on a real nats-server; 16 streaming clients run
// for 25 s while one worker is drained twice (SIGTERM with a short
// --drain-timeout, so that streams still running then are handed back with
// the drain notice) and restarted. No stream fails: each handed-back
// stream is continued on another worker (infera_migrations_total
// {reason="worker_draining"}), and long probe streams started before each
// drain read exactly the text of the same request run without faults.
//
// Without the hand-back (serve with --migration-limit 0) the same run
// fails the streams the drain cuts.

const (
	natsDrainRun      = 25 * time.Second
	natsDrainTimeout  = "1s"
	natsDrainProbeLen = 300 // about 3 s: running when the drain times out
)

// natsDrainSimArgs: real time, fast prefill, 1 ms per token and running
// sequence (about 10 ms a step under this load), so the
// bench's 150-token streams (1.5 s) and the probes outlive the drain timeout.
var natsDrainSimArgs = []string{"--time-scale", "1", "--prefill-tokens-per-s", "1000000", "--decode-ms-per-token", "1"}

func TestDrainOverNATSStreaming(t *testing.T) {
	ns := natstest.Start(t)
	natsFlags := []string{"--request-transport", "nats", "--nats-server", ns.URL(), "--nats-req-max-pending", "64",
		"--nats-req-idle-timeout", "10s"}
	f := startServe(t, append([]string{"--log-level", "info", "--request-max-retries", "2",
		"--ttft-timeout", "5s", "--stream-idle-timeout", "5s", "--migration-limit", "3"}, natsFlags...)...)
	wflags := append([]string{"--drain-timeout", natsDrainTimeout}, natsFlags...)
	starts := 0
	startMember := func(name string) (*proc, string) {
		starts++
		return f.startWorkerFlags(fmt.Sprintf("nats-drain-%s-%d", name, starts), wflags, natsDrainSimArgs...)
	}
	startMember("a")
	startMember("b")
	victim, victimID := startMember("c")
	activeWorkers := func(n int) func(map[string]string) bool {
		return func(w map[string]string) bool {
			k := 0
			for _, s := range w {
				if s == "active" {
					k++
				}
			}
			return k == n
		}
	}
	f.waitWorkers("three active nats workers", 30*time.Second, activeWorkers(3))

	want := probeTexts(t, f.base, natsDrainProbeLen)

	b := startBench(t, "--url", f.base, "--model", "sim-model", "--requests", "0",
		"--duration", natsDrainRun.String(), "--concurrency", "16", "--input-len", "32", "--output-len", "150",
		"--stream=true", "--timeout", "5m")

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	probes := newProbeRounds(t, ctx, f.base, natsDrainProbeLen)
	handedBack := 0
	for round := range 2 {
		time.Sleep(6 * time.Second)
		// Probes first, so that some run on the victim when it drains.
		probes.start(round)
		victim.signal(syscall.SIGTERM)
		if err := victim.wait(40 * time.Second); err != nil {
			t.Errorf("drained worker %s exited with %v, want 0; log:\n%s", victimID, err, victim.logText())
		}
		if strings.Contains(victim.logText(), "migratable requests handed back to the router") {
			handedBack++
		}
		victim, victimID = startMember("c")
	}

	rep, out, err := b.wait(t, 2*natsDrainRun)
	if err != nil || len(rep.Errors) != 0 {
		t.Errorf("bench: %v; failed streams %v, want none; output:\n%s", err, rep.Errors, out)
	}
	probes.check(want)
	if handedBack != 2 {
		t.Errorf("%d of 2 drains handed streams back: the drain timeout cut nothing", handedBack)
	}
	metrics := scrape(t, f.base+"/metrics")
	draining := metricValue(metrics, "infera_migrations_total", `reason="worker_draining"`)
	broken := metricValue(metrics, "infera_migrations_total", `reason="stream_broken"`)
	failed := metricValue(metrics, "infera_migrations_failed_total")
	if draining == 0 || failed != 0 {
		t.Errorf("migrations: %v worker_draining, %v stream_broken, %v failed; want some worker_draining and none failed", draining, broken, failed)
	}
	t.Logf("drain over nats: %d requests, ttft %v, migrations %v (worker_draining) + %v (stream_broken), per worker %v",
		rep.Requests, rep.TTFT, draining, broken, rep.PerWorker)
}
