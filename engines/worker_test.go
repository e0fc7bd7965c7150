package engines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
)

const testPrefix = "/infera/workers/"

// workerRun is one Run of a worker against a fake engine process (this test
// binary, see runFakeEngine) and an embedded etcd.
type workerRun struct {
	t      *testing.T
	cli    *clientv3.Client
	state  string // the fake engine's --state-dir
	log    *testkit.LogSink
	cancel context.CancelFunc
	done   chan error
}

// startWorker runs a worker; tune may adjust the configuration first.
func startWorker(t *testing.T, tune func(*config.Worker)) *workerRun {
	t.Helper()
	t.Setenv(fakeEngineEnv, "1")
	// A -race engine otherwise sleeps 1s at exit (ThreadSanitizer's default).
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	endpoints := etcdtest.Start(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	cfg := config.Worker{
		Etcd:              config.Etcd{Endpoints: endpoints, Prefix: testPrefix, DialTimeout: 5 * time.Second},
		Engine:            "sim",
		EngineBin:         exe,
		LeaseTTL:          10 * time.Second, // long: a record gone at once was revoked, not expired
		KeepAliveInterval: time.Second,
		ReadyTimeout:      time.Minute,
		HealthInterval:    20 * time.Millisecond,
		DrainTimeout:      time.Minute,
		StopGrace:         5 * time.Second,
		EngineArgs:        []string{"--state-dir", state, "--served-model-name", "test-model", "--block-size", "32"},
	}
	if tune != nil {
		tune(&cfg)
	}
	log, buf := newTestLogger(t)
	ctx, cancel := context.WithCancel(t.Context())
	w := &workerRun{t: t, cli: etcdtest.Client(t, endpoints), state: state, log: buf, cancel: cancel, done: make(chan error, 1)}
	go func() { w.done <- Run(ctx, cfg, log) }()
	t.Cleanup(func() {
		// A failed test must still end the worker (and its engine) before
		// etcd stops and goleak looks.
		cancel()
		<-w.done
	})
	return w
}

// records returns the raw values under the prefix.
func (w *workerRun) records() []string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 5*time.Second)
	defer cancel()
	resp, err := w.cli.Get(ctx, testPrefix, clientv3.WithPrefix())
	if err != nil {
		w.t.Fatalf("etcd get: %v", err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Value))
	}
	return out
}

// waitRecord waits until exactly one record is present and decodes it.
func (w *workerRun) waitRecord(cond func(discovery.Record) bool) (discovery.Record, string) {
	w.t.Helper()
	var rec discovery.Record
	var raw string
	testkit.Eventually(w.t, "worker record", func() bool {
		select {
		case err := <-w.done:
			w.t.Fatalf("Run returned early: %v", err)
		default:
		}
		recs := w.records()
		if len(recs) != 1 {
			return false
		}
		var err error
		if rec, err = discovery.DecodeRecord([]byte(recs[0])); err != nil {
			w.t.Fatalf("record %s: %v", recs[0], err)
		}
		raw = recs[0]
		return cond == nil || cond(rec)
	})
	// The record is in etcd a moment before Register returns; a test that
	// cancelled in between would see the worker give up registering.
	testkit.Eventually(w.t, "worker registered", func() bool { return len(w.log.Find(w.t, "worker registered")) > 0 })
	return rec, raw
}

// wait returns Run's result.
func (w *workerRun) wait() error {
	w.t.Helper()
	select {
	case err := <-w.done:
		w.done <- err // for the cleanup
		return err
	case <-time.After(time.Minute):
		w.t.Fatal("Run did not return")
		return nil
	}
}

func (w *workerRun) setRunning(n int) {
	w.t.Helper()
	path := filepath.Join(w.state, "running")
	if err := os.WriteFile(path+".tmp", []byte(strconv.Itoa(n)), 0o644); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		w.t.Fatal(err)
	}
}

// enginePID is the engine's pid as the supervisor logged it.
func (w *workerRun) enginePID() int {
	w.t.Helper()
	var pid int
	testkit.Eventually(w.t, "engine started", func() bool {
		e := w.log.Find(w.t, "engine started")
		if len(e) == 0 {
			return false
		}
		f, _ := e[0]["pid"].(float64)
		pid = int(f)
		return pid > 0
	})
	return pid
}

func TestWorkerRegistersAndDrains(t *testing.T) {
	w := startWorker(t, nil)
	rec, raw := w.waitRecord(nil)

	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &fields); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"model_name": `"test-model"`, "engine": `"vllm"`, "real_engine": `"sim"`, "disagg_mode": `"mixed"`, "disagg_meta": `{}`,
		"kv_block_size": `32`, "dp_size": `1`, "dp_rank": `null`, "request_transport": `"http"`,
		"status": `"active"`,
	}
	for k, v := range want {
		if string(fields[k]) != v {
			t.Errorf("record field %s = %s, want %s (record %s)", k, fields[k], v, raw)
		}
	}
	if !strings.HasPrefix(rec.WorkerID, "127.0.0.1:") || rec.URL != "http://"+rec.WorkerID {
		t.Errorf("worker_id %q url %q: want 127.0.0.1:<port> and its URL", rec.WorkerID, rec.URL)
	}
	// The worker gave the sim a publisher and a replay socket on free ports
	// of its host and advertises both.
	pub, replay := ptrValue(rec.KVEventsEndpoint), ptrValue(rec.KVEventsReplayEndpoint)
	if !strings.HasPrefix(pub, "tcp://127.0.0.1:") || !strings.HasPrefix(replay, "tcp://127.0.0.1:") || pub == replay {
		t.Errorf("kv_events_endpoint %q replay %q: want two tcp://127.0.0.1:<port>", pub, replay)
	}
	started := w.log.Find(t, "engine started")
	if len(started) != 1 || !strings.Contains(fmt.Sprint(started[0]["args"]), "--kv-events-endpoint "+pub+" --kv-events-replay-endpoint "+replay) {
		t.Errorf("engine started with %v, want the advertised endpoints passed to the sim", started)
	}
	reg := w.log.Find(t, "worker registered")
	if len(reg) != 1 || reg[0]["worker_id"] != rec.WorkerID {
		t.Fatalf("\"worker registered\" entries %v, want one with worker_id %s", reg, rec.WorkerID)
	}
	// The advertised URL reaches the engine.
	resp, err := http.Get(rec.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("engine /health = %d", resp.StatusCode)
	}
	pid := w.enginePID()

	// A request in flight: the drain must wait for it.
	w.setRunning(1)
	w.cancel()
	w.waitRecord(func(r discovery.Record) bool { return r.Status == discovery.StatusDraining })
	testkit.Eventually(t, "drain polls seeing the running request", func() bool {
		return len(w.log.Find(t, "metrics scraped running=1")) >= 3
	})
	select {
	case err := <-w.done:
		t.Fatalf("Run returned %v while a request was running", err)
	default:
	}
	if n := len(w.records()); n != 1 {
		t.Fatalf("%d records while draining, want the draining one", n)
	}
	if len(w.log.Find(t, "worker draining")) != 1 {
		t.Error("no \"worker draining\" entry")
	}

	w.setRunning(0)
	if err := w.wait(); err != nil {
		t.Fatalf("Run = %v, want nil after a drain", err)
	}
	if n := len(w.records()); n != 0 {
		t.Fatalf("%d records after the drain, want none", n)
	}
	if len(w.log.Find(t, "engine idle, drain complete")) != 1 {
		t.Error("no \"engine idle, drain complete\" entry")
	}
	testkit.Eventually(t, "engine stopped", func() bool { return processGone(pid) })
	// The engine's own output went into the worker log with its pid.
	lines := w.log.Find(t, "metrics scraped running=1")
	if lines[0]["engine"] != "sim" || lines[0]["pid"] != float64(pid) {
		t.Errorf("engine line %v: want engine=sim pid=%d", lines[0], pid)
	}
}

func TestWorkerEngineDies(t *testing.T) {
	w := startWorker(t, nil)
	w.waitRecord(nil)
	if err := syscall.Kill(w.enginePID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := w.wait()
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("Run = %v, want ErrExited with the exit status", err)
	}
	// Revoked before Run returned, long before the 10s TTL could expire it.
	if n := len(w.records()); n != 0 {
		t.Fatalf("%d records after the engine died, want none", n)
	}
	if len(w.log.Find(t, "worker deregistered")) != 1 {
		t.Error("no \"worker deregistered\" entry")
	}
}

func TestWorkerDrainTimeout(t *testing.T) {
	w := startWorker(t, func(c *config.Worker) { c.DrainTimeout = 300 * time.Millisecond })
	w.setRunning(2)
	w.waitRecord(nil)
	w.cancel()
	if err := w.wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if n := len(w.records()); n != 0 {
		t.Fatalf("%d records after the drain timeout, want none", n)
	}
	e := w.log.Find(t, "drain timeout passed with requests in flight")
	if len(e) != 1 || e[0]["running"] != float64(2) {
		t.Fatalf("drain timeout entries %v, want one with running=2; log:\n%s", e, logMessages(t, w.log))
	}
}

func TestWorkerBlockSizeFromMetrics(t *testing.T) {
	w := startWorker(t, func(c *config.Worker) {
		c.EngineArgs = []string{"--state-dir", c.EngineArgs[1], "--metrics-block-size", "64", "--metrics-kv-blocks", "4096"}
	})
	rec, _ := w.waitRecord(nil)
	if rec.KVBlockSize == nil || *rec.KVBlockSize != 64 {
		t.Fatalf("kv_block_size %v, want 64 as the engine reports", rec.KVBlockSize)
	}
	if rec.KVCapacityBlocks != 4096 {
		t.Fatalf("kv_capacity_blocks %d, want 4096 as the engine reports (num_gpu_blocks)", rec.KVCapacityBlocks)
	}
	if rec.ModelName != "sim-model" {
		t.Fatalf("model_name %q, want the sim default", rec.ModelName)
	}
}

func TestWorkerAdvertiseHost(t *testing.T) {
	w := startWorker(t, func(c *config.Worker) { c.AdvertiseHost = "node-7.example" })
	rec, _ := w.waitRecord(nil)
	if !strings.HasPrefix(rec.WorkerID, "node-7.example:") || rec.URL != "http://"+rec.WorkerID {
		t.Fatalf("worker_id %q url %q: want the advertised host", rec.WorkerID, rec.URL)
	}
	if rec.KVCapacityBlocks != 0 {
		t.Fatalf("kv_capacity_blocks %d from an engine that reports no num_gpu_blocks, want 0 (absent)", rec.KVCapacityBlocks)
	}
}

func TestWorkerStopBeforeReady(t *testing.T) {
	w := startWorker(t, func(c *config.Worker) {
		if err := os.WriteFile(filepath.Join(c.EngineArgs[1], "unhealthy"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	pid := w.enginePID()
	w.cancel()
	if err := w.wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if n := len(w.records()); n != 0 {
		t.Fatalf("%d records, want none", n)
	}
	testkit.Eventually(t, "engine stopped", func() bool { return processGone(pid) })
}

func TestWorkerReadyTimeout(t *testing.T) {
	w := startWorker(t, func(c *config.Worker) {
		c.ReadyTimeout = 200 * time.Millisecond
		if err := os.WriteFile(filepath.Join(c.EngineArgs[1], "unhealthy"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	pid := w.enginePID()
	if err := w.wait(); !errors.Is(err, ErrNotHealthy) {
		t.Fatalf("Run = %v, want ErrNotHealthy", err)
	}
	testkit.Eventually(t, "engine stopped", func() bool { return processGone(pid) })
}

func TestWorkerEngineFailsToStart(t *testing.T) {
	// Without --state-dir the fake engine exits 2 at once.
	w := startWorker(t, func(c *config.Worker) { c.EngineArgs = []string{"--model", "m"} })
	err := w.wait()
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("Run = %v, want ErrExited with exit status 2", err)
	}
	if n := len(w.records()); n != 0 {
		t.Fatalf("%d records, want none", n)
	}
}

func TestWorkerBadEngineArgs(t *testing.T) {
	log, _ := newTestLogger(t)
	cfg := config.Worker{Engine: "sim", EngineBin: "/nonexistent", EngineArgs: []string{"--port", "http"}}
	if err := Run(t.Context(), cfg, log); !errors.Is(err, ErrEngineArgs) {
		t.Fatalf("Run = %v, want ErrEngineArgs", err)
	}
	cfg = config.Worker{Engine: "tgi"}
	if err := Run(t.Context(), cfg, log); !errors.Is(err, ErrUnknownEngine) {
		t.Fatalf("Run = %v, want ErrUnknownEngine", err)
	}
}

func TestAdvertiseHost(t *testing.T) {
	for _, tc := range []struct{ flag, bind, want string }{
		{"", "127.0.0.1", "127.0.0.1"},
		{"", "node-1", "node-1"},
		{"10.0.0.5", "0.0.0.0", "10.0.0.5"},
		{"", "::1", "::1"},
	} {
		if got, err := advertiseHost(tc.flag, tc.bind, nil); err != nil || got != tc.want {
			t.Errorf("advertiseHost(%q, %q) = %q, %v; want %q", tc.flag, tc.bind, got, err, tc.want)
		}
	}
	// Binding every interface advertises a routable address of this
	// machine, never 0.0.0.0.
	if got, err := advertiseHost("", "0.0.0.0", nil); err == nil && (isUnspecified(got) || isLoopback(got)) {
		t.Errorf("advertiseHost for 0.0.0.0 = %q", got)
	}
	ipnet := func(s string) net.Addr {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return n
	}
	machine := func(ifs ...netInterface) func() ([]netInterface, error) {
		return func() ([]netInterface, error) { return ifs, nil }
	}
	lo := netInterface{Up: true, Loopback: true, Addrs: []net.Addr{ipnet("127.0.0.1/8"), ipnet("::1/128")}}
	for _, tc := range []struct {
		name string
		ifs  func() ([]netInterface, error)
		want string
	}{
		{"first IPv4 of an up interface", machine(lo,
			netInterface{Up: false, Addrs: []net.Addr{ipnet("10.9.9.9/24")}},
			netInterface{Up: true, Addrs: []net.Addr{ipnet("fe80::1/64"), ipnet("169.254.3.4/16"), ipnet("2001:db8::7/64"), ipnet("10.0.0.5/24")}},
			netInterface{Up: true, Addrs: []net.Addr{ipnet("192.168.1.2/24")}}), "10.0.0.5"},
		{"global IPv6 when no IPv4", machine(lo, netInterface{Up: true, Addrs: []net.Addr{ipnet("fe80::1/64"), ipnet("2001:db8::7/64")}}), "2001:db8::7"},
		{"IPAddr form", machine(netInterface{Up: true, Addrs: []net.Addr{&net.IPAddr{IP: net.ParseIP("10.1.1.1")}}}), "10.1.1.1"},
	} {
		for _, bind := range []string{"0.0.0.0", "::", "", "*"} {
			if got, err := advertiseHost("", bind, tc.ifs); err != nil || got != tc.want {
				t.Errorf("%s: advertiseHost(%q) = %q, %v; want %q", tc.name, bind, got, err, tc.want)
			}
		}
	}
	if got, err := advertiseHost("", "0.0.0.0", machine(lo)); !errors.Is(err, ErrAdvertiseHost) {
		t.Errorf("loopback-only machine: advertiseHost = %q, %v; want ErrAdvertiseHost", got, err)
	}
	if _, err := advertiseHost("", "0.0.0.0", func() ([]netInterface, error) { return nil, errors.New("boom") }); !errors.Is(err, ErrAdvertiseHost) {
		t.Error("interface listing error not reported")
	}
	for bind, want := range map[string]string{"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1", "10.1.2.3": "10.1.2.3", "host": "host"} {
		if got := localHost(bind); got != want {
			t.Errorf("localHost(%q) = %q, want %q", bind, got, want)
		}
	}
}

// TestWorkerEtcdUnreachable: the engine is up but etcd is not; the worker
// keeps trying to register and still shuts down cleanly.
func TestWorkerEtcdUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close() // nothing listens there now
	w := startWorker(t, func(c *config.Worker) {
		c.Etcd.Endpoints = []string{dead}
		c.LeaseTTL = time.Second // bounds each registration attempt
		c.KeepAliveInterval = 300 * time.Millisecond
	})
	pid := w.enginePID()
	testkit.Eventually(t, "registration retried", func() bool {
		return len(w.log.Find(t, "worker registration failed, retrying")) >= 2
	})
	w.cancel()
	if err := w.wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	testkit.Eventually(t, "engine stopped", func() bool { return processGone(pid) })
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// TestWorkerSGLang runs the SGLang adapter against a process that answers
// like SGLang: the worker adds --enable-metrics and a KV-event publisher,
// takes the page size and the cache size from /get_server_info and drains on SGLang's metric
// names.
func TestWorkerSGLang(t *testing.T) {
	w := startWorker(t, func(c *config.Worker) {
		t.Setenv(fakeEngineEnv, "sglang")
		c.Engine = "sglang"
		c.EngineArgs = []string{"--model-path", "/models/qwen3", "--served-model-name", "qwen3", "--host", "127.0.0.1",
			"--state-dir", c.EngineArgs[1], "--metrics-block-size", "64", "--metrics-kv-blocks", "2048"}
	})
	rec, raw := w.waitRecord(nil)
	if rec.Engine != "sglang" || rec.ModelName != "qwen3" || ptrValue(rec.KVBlockSize) != 64 || rec.KVCapacityBlocks != 2048 {
		t.Fatalf("record %s: want engine sglang, model qwen3, kv_block_size 64 and kv_capacity_blocks 2048 (max_total_num_tokens ÷ page_size) from /get_server_info", raw)
	}
	if !strings.HasPrefix(ptrValue(rec.KVEventsEndpoint), "tcp://127.0.0.1:") || rec.KVEventsReplayEndpoint == nil {
		t.Fatalf("record %s: want the KV-event endpoints the worker configured", raw)
	}
	started := w.log.Find(t, "engine started")
	if len(started) != 1 {
		t.Fatalf("%d \"engine started\" entries, want one", len(started))
	}
	args := fmt.Sprint(started[0]["args"])
	if !strings.Contains(args, "--enable-metrics") || !strings.Contains(args, `"publisher":"zmq"`) {
		t.Fatalf("engine started with %v: want --enable-metrics and a zmq --kv-events-config", args)
	}
	w.setRunning(1)
	w.cancel()
	w.waitRecord(func(r discovery.Record) bool { return r.Status == discovery.StatusDraining })
	testkit.Eventually(t, "drain polls seeing the running request", func() bool {
		return len(w.log.Find(t, "metrics scraped running=1")) >= 2
	})
	w.setRunning(0)
	if err := w.wait(); err != nil {
		t.Fatalf("Run = %v, want nil after a drain", err)
	}
	if n := len(w.records()); n != 0 {
		t.Fatalf("%d records after the drain, want none", n)
	}
}

// TestWorkerVLLMExternalDP runs the vLLM adapter for one rank of an
// externally balanced data-parallel deployment.
func TestWorkerVLLMExternalDP(t *testing.T) {
	w := startWorker(t, func(c *config.Worker) {
		t.Setenv(fakeEngineEnv, "vllm")
		c.Engine = "vllm"
		c.EngineArgs = []string{"/models/llama", "--host", "127.0.0.1", "--data-parallel-size", "4", "--data-parallel-rank", "2",
			"--state-dir", c.EngineArgs[1], "--metrics-block-size", "32"}
	})
	rec, raw := w.waitRecord(nil)
	if rec.Engine != "vllm" || rec.ModelName != "/models/llama" || ptrValue(rec.DPRank) != 2 || rec.DPSize != 4 ||
		ptrValue(rec.KVBlockSize) != 32 {
		t.Fatalf("record %s: want vllm rank 2 of 4, kv_block_size 32 from vllm:cache_config_info", raw)
	}
	if !strings.HasPrefix(ptrValue(rec.KVEventsEndpoint), "tcp://127.0.0.1:") {
		t.Fatalf("record %s: want a KV-event endpoint", raw)
	}
}
