package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestEtcdOutage (issue 5, acceptance 2): a real etcd server process is
// SIGKILLed for 10 s under unary and streaming load and restarted on the same
// ports and data directory. No request fails because of it: the router keeps
// routing on its last fleet snapshot. A worker started during the outage
// keeps retrying its registration; after the restart the router's fleet view
// converges and the new worker receives traffic.
func TestEtcdOutage(t *testing.T) {
	const outage = 10 * time.Second
	etcd := newEtcdServer(t)
	etcd.start(30 * time.Second)

	f := startServe(t, "--log-level", "info", "--etcd-endpoints", etcd.endpoint())
	f.etcd = etcd.endpoint()
	_, idA := f.startWorker("worker-a", "--time-scale", "0.5")
	_, idB := f.startWorker("worker-b", "--time-scale", "0.5")
	f.waitWorkers("both workers", 15*time.Second, func(w map[string]string) bool {
		return w[idA] == "active" && w[idB] == "active"
	})

	// The load spans the outage and the restart.
	load := func(stream bool) *bgBench {
		return startBench(t, "--url", f.base, "--model", "sim-model",
			"--requests", "0", "--duration", (outage + 12*time.Second).String(), "--concurrency", "8",
			"--input-len", "32", "--output-len", "16", fmt.Sprintf("--stream=%t", stream), "--timeout", "2m")
	}
	unary, streaming := load(false), load(true)
	time.Sleep(2 * time.Second) // pacing: let the load run before the fault

	etcd.kill()
	killed := time.Now()
	late := start(t, "worker-late", workerArgs(etcd.endpoint(), "--time-scale", "0.5")...)
	// The router keeps serving on its last snapshot while etcd is down.
	for i := 0; time.Since(killed) < outage; i++ {
		status, _, body, err := chat(t.Context(), f.base, i%2 == 0, fmt.Sprintf("during the outage %d", i), 4)
		if err != nil || status != http.StatusOK {
			t.Errorf("request %d during the etcd outage: status %d err %v body %s", i, status, err, body)
		}
		time.Sleep(200 * time.Millisecond) // pacing
	}
	select {
	case <-late.done:
		t.Fatalf("the worker started during the outage exited: %v; log:\n%s", late.exit, late.logText())
	default:
	}

	etcd.start(30 * time.Second)
	line := late.waitLog("worker registered", 60*time.Second)
	idC, _ := line["worker_id"].(string)
	if idC == "" {
		t.Fatalf("worker registered line has no worker_id: %v", line)
	}
	f.waitWorkers("the fleet view to converge on three workers", 30*time.Second, func(w map[string]string) bool {
		return len(w) == 3 && w[idA] == "active" && w[idB] == "active" && w[idC] == "active"
	})
	// Round-robin reaches the new worker within a few requests.
	served := map[string]int{}
	for i := 0; i < 30 && served[idC] == 0; i++ {
		status, worker, body, err := chat(t.Context(), f.base, false, fmt.Sprintf("after the outage %d", i), 4)
		if err != nil || status != http.StatusOK {
			t.Fatalf("request %d after etcd came back: status %d err %v body %s", i, status, err, body)
		}
		served[worker]++
	}
	if served[idC] == 0 {
		t.Errorf("the worker registered during the outage got no traffic: %v", served)
	}

	// The outage is logged (about) once at warn level, not once per retry
	// and not never.
	var etcdWarnings []string
	f.serve.mu.Lock()
	for _, l := range f.serve.lines {
		if text := fmt.Sprint(l); (l["level"] == "warn" || l["level"] == "error") && strings.Contains(text, "etcd") {
			etcdWarnings = append(etcdWarnings, text)
		}
	}
	f.serve.mu.Unlock()
	if n := len(etcdWarnings); n == 0 || n > 5 {
		t.Errorf("serve logged %d warnings about the etcd outage, want about one:\n%s", n, strings.Join(etcdWarnings, "\n"))
	}

	for name, b := range map[string]*bgBench{"unary": unary, "streaming": streaming} {
		rep, out, err := b.wait(t, 2*time.Minute)
		if err != nil || len(rep.Errors) != 0 || rep.Requests == 0 {
			t.Errorf("%s load across the etcd outage: %v; %d requests, errors %v; output:\n%s", name, err, rep.Requests, rep.Errors, out)
		}
		t.Logf("%s load: %d requests, per worker %v", name, rep.Requests, rep.PerWorker)
	}
}

// TestEtcdStopLongerThanLease (issue 12, acceptance 6): a real etcd is
// SIGSTOPped for longer than the workers' lease TTL under unary and
// streaming load. On SIGCONT etcd expires every lease and deletes every
// record before the workers re-register; with --etcd-outage-grace the
// router holds those removals, so no request fails (no 404
// model_not_found window) and /ready stays 200 throughout.
func TestEtcdStopLongerThanLease(t *testing.T) {
	const (
		ttl    = 3 * time.Second
		freeze = ttl + 4*time.Second
		after  = 10 * time.Second
	)
	etcd := newEtcdServer(t)
	etcd.start(30 * time.Second)
	f := startServe(t, "--log-level", "info", "--etcd-endpoints", etcd.endpoint(), "--etcd-outage-grace", "10s")
	f.etcd = etcd.endpoint()
	worker := func(name string) string {
		p := start(t, name, "worker", "--engine", "sim", "--etcd-endpoints", etcd.endpoint(),
			"--lease-ttl", ttl.String(), "--keepalive-interval", "1s", "--stop-grace", "5s",
			"--", "--model", "sim-model", "--time-scale", "0.5")
		line := p.waitLog("worker registered", 60*time.Second)
		id, _ := line["worker_id"].(string)
		return id
	}
	idA, idB := worker("worker-a"), worker("worker-b")
	f.waitWorkers("both workers", 15*time.Second, func(w map[string]string) bool {
		return w[idA] == "active" && w[idB] == "active"
	})

	load := func(stream bool) *bgBench {
		return startBench(t, "--url", f.base, "--model", "sim-model",
			"--requests", "0", "--duration", (freeze + after + 2*time.Second).String(), "--concurrency", "8",
			"--input-len", "32", "--output-len", "8", fmt.Sprintf("--stream=%t", stream), "--timeout", "2m")
	}
	unary, streaming := load(false), load(true)
	time.Sleep(2 * time.Second) // pacing: let the load run before the fault

	if err := syscall.Kill(etcd.p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(etcd.p.cmd.Process.Pid, syscall.SIGCONT)
		}
	}()
	time.Sleep(freeze) // the fault: longer than the lease TTL
	if err := syscall.Kill(etcd.p.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false

	// Right after the resume, when the leases expire and the workers
	// re-register: every request succeeds and the router stays ready.
	resumed := time.Now()
	failed := 0
	for i := 0; time.Since(resumed) < after; i++ {
		status, _, body, err := chat(t.Context(), f.base, i%2 == 0, fmt.Sprintf("after the freeze %d", i), 2)
		if err != nil || status != http.StatusOK {
			failed++
			if failed <= 5 {
				t.Errorf("request %d, %v after etcd resumed: status %d err %v body %s", i, time.Since(resumed).Round(time.Millisecond), status, err, body)
			}
		}
		resp, err := http.Get(f.base + "/ready")
		if err != nil {
			t.Fatalf("/ready: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("/ready = %d %v after etcd resumed", resp.StatusCode, time.Since(resumed).Round(time.Millisecond))
		}
		time.Sleep(10 * time.Millisecond) // pacing
	}
	if failed > 0 {
		t.Errorf("%d requests failed after etcd resumed", failed)
	}
	// The leases did expire (otherwise the test proves nothing): the
	// workers re-registered, and the router held their removal.
	f.serve.mu.Lock()
	held, removed := 0, 0
	for _, l := range f.serve.lines {
		m, _ := l["message"].(string)
		if strings.HasPrefix(m, "worker record deleted just after an etcd interruption") || strings.HasPrefix(m, "worker missing from the re-list") {
			held++
		}
		if m == "worker removed" {
			removed++ // the router dropped a worker: the 404 window
		}
	}
	f.serve.mu.Unlock()
	if removed > 0 {
		t.Errorf("the router removed %d workers across the freeze:\n%s", removed, grepLines(f.serve.logText(), "removed", "held", "listed", "re-register"))
	}
	if held == 0 {
		t.Errorf("no removal was held: the leases did not expire during the freeze?\n%s", grepLines(f.serve.logText(), "removed", "held", "listed", "etcd", "re-register"))
	}
	f.waitWorkers("both workers after the freeze", 15*time.Second, func(w map[string]string) bool {
		return len(w) == 2 && w[idA] == "active" && w[idB] == "active"
	})
	for name, b := range map[string]*bgBench{"unary": unary, "streaming": streaming} {
		rep, out, err := b.wait(t, 2*time.Minute)
		if err != nil || len(rep.Errors) != 0 || rep.Requests == 0 {
			t.Errorf("%s load across the etcd freeze: %v; %d requests, errors %v; output:\n%s", name, err, rep.Requests, rep.Errors, out)
		}
		t.Logf("%s load: %d requests, per worker %v", name, rep.Requests, rep.PerWorker)
	}
}

// grepLines returns the lines of text that contain any of words.
func grepLines(text string, words ...string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// TestEtcdStartsAgainWhenPortTaken: the harness's etcd whose client port
// another process bound after it was picked (as an outgoing connection or
// another test's server can) starts again on other ports instead of
// failing the test (startEtcdCluster does the same for a whole cluster).
func TestEtcdStartsAgainWhenPortTaken(t *testing.T) {
	etcd := newEtcdServer(t)
	taken := etcd.clientPort
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", taken))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	etcd.start(30 * time.Second)
	if etcd.clientPort == taken {
		t.Fatalf("etcd healthy on the taken port %d", taken)
	}
	if err := etcd.healthy(); err != nil {
		t.Fatal(err)
	}
}
