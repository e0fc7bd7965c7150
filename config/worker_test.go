package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// parseWorker runs a real cli parse of the worker flags.
func parseWorker(t *testing.T, args ...string) Worker {
	t.Helper()
	var w Worker
	app := &cli.App{
		Flags: w.Flags(),
		Action: func(c *cli.Context) error {
			w.Finish(c)
			return nil
		},
	}
	if err := app.Run(append([]string{"worker"}, args...)); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return w
}

func TestWorkerDefaults(t *testing.T) {
	w := parseWorker(t, "--engine", "sim", "--", "--model", "m", "--port=9000")
	if err := w.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if !slices.Equal(w.EngineArgs, []string{"--model", "m", "--port=9000"}) {
		t.Errorf("engine args %q", w.EngineArgs)
	}
	if !slices.Equal(w.Etcd.Endpoints, []string{DefaultWorkerEtcdEndpoint}) {
		t.Errorf("etcd endpoints %q, want the embedded etcd default", w.Etcd.Endpoints)
	}
	if w.Python != "python3" || w.NoKVEvents || w.EngineBin != "" || w.AdvertiseHost != "" {
		t.Errorf("python %q no-kv-events %v engine-bin %q advertise-host %q", w.Python, w.NoKVEvents, w.EngineBin, w.AdvertiseHost)
	}
	want := map[string][2]time.Duration{
		"lease-ttl":          {w.LeaseTTL, 10 * time.Second},
		"keepalive-interval": {w.KeepAliveInterval, 3 * time.Second},
		"drain-timeout":      {w.DrainTimeout, 30 * time.Second},
		"ready-timeout":      {w.ReadyTimeout, 10 * time.Minute},
		"health-interval":    {w.HealthInterval, 500 * time.Millisecond},
		"stop-grace":         {w.StopGrace, 10 * time.Second},
	}
	for name, v := range want {
		if v[0] != v[1] {
			t.Errorf("--%s = %v, want %v", name, v[0], v[1])
		}
	}
}

func TestWorkerEnvAndFlags(t *testing.T) {
	t.Setenv("INFERA_ENGINE", "sim")
	t.Setenv("INFERA_DRAIN_TIMEOUT", "5s")
	t.Setenv("INFERA_ETCD_ENDPOINTS", "http://10.0.0.1:2379,http://10.0.0.2:2379")
	t.Setenv("INFERA_NO_KV_EVENTS", "true")
	t.Setenv("INFERA_PYTHON", "/opt/venv/bin/python")
	w := parseWorker(t, "--drain-timeout", "7s", "--advertise-host", "node-1")
	if !w.NoKVEvents || w.Python != "/opt/venv/bin/python" {
		t.Errorf("no-kv-events %v python %q from the environment", w.NoKVEvents, w.Python)
	}
	if w.Engine != "sim" || w.DrainTimeout != 7*time.Second || w.AdvertiseHost != "node-1" {
		t.Errorf("engine %q drain %v advertise %q", w.Engine, w.DrainTimeout, w.AdvertiseHost)
	}
	if !slices.Equal(w.Etcd.Endpoints, []string{"http://10.0.0.1:2379", "http://10.0.0.2:2379"}) {
		t.Errorf("etcd endpoints %q", w.Etcd.Endpoints)
	}
	if len(w.EngineArgs) != 0 {
		t.Errorf("engine args %q, want none", w.EngineArgs)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestWorkerValidateReportsAll(t *testing.T) {
	w := parseWorker(t,
		"--lease-ttl", "500ms",
		"--keepalive-interval", "1s",
		"--ready-timeout", "0s",
		"--health-interval", "-1s",
		"--drain-timeout", "-1s",
		"--stop-grace", "-1s",
		"--advertise-host", "http://x:1",
		"--python", "",
		"--log-level", "loud",
	)
	err := w.Validate()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Validate = %v, want ErrInvalid", err)
	}
	for _, want := range []string{
		"--engine is required", "--lease-ttl", "--keepalive-interval", "--ready-timeout", "--health-interval",
		"--drain-timeout", "--stop-grace", "--advertise-host", "--python", "--log-level",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not report %s", err, want)
		}
	}
}

func TestWorkerValidateEngine(t *testing.T) {
	w := parseWorker(t, "--engine", "tgi")
	err := w.Validate()
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "supported engines: sim, vllm, sglang, atom") {
		t.Fatalf("Validate = %v, want the supported engines listed", err)
	}
	for _, engine := range WorkerEngines {
		w := parseWorker(t, "--engine", engine)
		if err := w.Validate(); err != nil {
			t.Errorf("--engine %s: %v", engine, err)
		}
	}
	w = parseWorker(t, "--engine", "sim", "--keepalive-interval", "10s")
	if err := w.Validate(); err == nil || !strings.Contains(err.Error(), "less than --lease-ttl") {
		t.Fatalf("Validate = %v, want keepalive >= ttl refused", err)
	}
}

func TestWorkerPreflightFlags(t *testing.T) {
	w := parseWorker(t, "--engine", "sim")
	if w.AllowTCP || w.Preflight || w.JSON || w.SysfsRoot != "/sys" {
		t.Fatalf("defaults: allow-tcp %v preflight %v json %v sysfs-root %q", w.AllowTCP, w.Preflight, w.JSON, w.SysfsRoot)
	}
	t.Setenv("INFERA_DISAGGREGATION_ALLOW_TCP", "true")
	t.Setenv("INFERA_SYSFS_ROOT", "/fixture")
	w = parseWorker(t, "--preflight", "--json")
	if !w.AllowTCP || w.SysfsRoot != "/fixture" || !w.Preflight || !w.JSON {
		t.Fatalf("from env and flags: %+v", w)
	}
	// A node-only preflight needs no --engine.
	if err := w.Validate(); err != nil {
		t.Fatalf("--preflight without --engine: %v", err)
	}
	w = parseWorker(t, "--engine", "sim", "--json", "--sysfs-root", "")
	err := w.Validate()
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--json applies only with --preflight") || !strings.Contains(err.Error(), "--sysfs-root") {
		t.Fatalf("Validate: %v", err)
	}
}
