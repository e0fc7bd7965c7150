package engines

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/rocm"
)

// fixtureSysfs is a sysfs fixture tree of the rocm package.
func fixtureSysfs(name string) string { return filepath.Join("..", "rocm", "testdata", "sysfs", name) }

// pdArgs are a vLLM prefill engine's arguments with MoRI-IO as transfer.
var pdArgs = []string{"/models/ds", "--host", "0.0.0.0", "--port", "8000",
	`--kv-transfer-config={"kv_connector":"MoRIIOConnector","kv_role":"kv_producer"}`}

// TestPreflightGolden compares `infera worker --preflight` (text and
// --json) on the three fixture nodes with testdata/preflight (-update
// rewrites them).
func TestPreflightGolden(t *testing.T) {
	cases := []struct {
		name, fixture string
		cfg           config.Worker
		blocking      bool
	}{
		{"mi355x-prefill", "mi355x", config.Worker{Engine: "vllm", AdvertiseHost: "10.16.0.11", EngineArgs: pdArgs}, false},
		{"nordma-prefill", "nordma", config.Worker{Engine: "vllm", AdvertiseHost: "10.16.0.11", EngineArgs: pdArgs}, true},
		{"nordma-allow-tcp", "nordma", config.Worker{Engine: "vllm", AdvertiseHost: "10.16.0.11", EngineArgs: pdArgs, AllowTCP: true}, false},
		{"portdown-node", "portdown", config.Worker{}, true},
	}
	for _, tc := range cases {
		for _, asJSON := range []bool{false, true} {
			name, ext := tc.name, ".txt"
			if asJSON {
				ext = ".json"
			}
			t.Run(name+ext, func(t *testing.T) {
				cfg := tc.cfg
				cfg.SysfsRoot, cfg.Preflight, cfg.JSON, cfg.Python, cfg.NoKVEvents = fixtureSysfs(tc.fixture), true, asJSON, "python3", true
				var out bytes.Buffer
				seams := Options{portBlock: seqPorts(40000), interfaces: goldenMachine, newID: func() string { return "0123abcd" }}
				err := preflight(cfg, &out, seams)
				if tc.blocking != (err != nil) || (err != nil && !errors.Is(err, rocm.ErrPreflight)) {
					t.Fatalf("preflight: %v, want blocking %t", err, tc.blocking)
				}
				path := filepath.Join("testdata", "preflight", name+ext)
				if *update {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update to create it)", err)
				}
				if !bytes.Equal(out.Bytes(), want) {
					t.Errorf("%s differs (run with -update if the change is intended)\n--- got\n%s\n--- want\n%s", path, out.Bytes(), want)
				}
			})
		}
	}
}

// TestWorkerPDPreflight: a prefill worker on a node without RDMA refuses to
// start (naming what is missing) and registers with
// --disaggregation-allow-tcp.
func TestWorkerPDPreflight(t *testing.T) {
	tune := func(allow bool) func(*config.Worker) {
		return func(c *config.Worker) {
			t.Setenv(fakeEngineEnv, "vllm")
			c.Engine = "vllm"
			c.AdvertiseHost = "10.1.2.3" // routable: the missing RDMA device is the only finding
			c.SysfsRoot = fixtureSysfs("nordma")
			c.AllowTCP = allow
			c.EngineArgs = []string{"/models/ds", "--host", "127.0.0.1", "--state-dir", c.EngineArgs[1],
				`--kv-transfer-config={"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}`}
		}
	}
	t.Run("refused", func(t *testing.T) {
		w := startWorker(t, tune(false))
		err := <-w.done
		w.done <- err // for the cleanup
		if !errors.Is(err, rocm.ErrPreflight) || !strings.Contains(err.Error(), "nordma/class/infiniband") ||
			!strings.Contains(err.Error(), "--disaggregation-allow-tcp") {
			t.Fatalf("Run: %v, want a preflight refusal naming the missing RDMA device class", err)
		}
		if _, err := os.Stat(filepath.Join(w.state, "pid")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the engine was started before the refusal (pid file: %v)", err)
		}
		if n := len(w.records()); n != 0 {
			t.Fatalf("%d records, want none", n)
		}
	})
	t.Run("allow-tcp", func(t *testing.T) {
		w := startWorker(t, tune(true))
		rec, raw := w.waitRecord(nil)
		if rec.DisaggMode != discovery.DisaggPrefill || rec.WorkerID[:9] != "10.1.2.3:" {
			t.Fatalf("record %s: want a prefill worker advertised at 10.1.2.3", raw)
		}
		var warned bool
		for _, e := range w.log.Entries(t) {
			if e["code"] == "no_rdma_device" && e["level"] == "warn" {
				warned = true
			}
		}
		if !warned {
			t.Fatal("no warning about the missing RDMA device")
		}
	})
}
