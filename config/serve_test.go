package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
)

// parseServe runs the serve flags over args (and the environment) and
// returns the finished config.
func parseServe(t *testing.T, args ...string) config.Serve {
	t.Helper()
	var s config.Serve
	app := &cli.App{Flags: s.Flags(), Action: func(c *cli.Context) error { s.Finish(c); return nil }}
	if err := app.Run(append([]string{"serve"}, args...)); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestServeDefaultsValid(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "/var/lib/x")
	s := parseServe(t)
	s.KnownPolicies = []string{"least-load", "round-robin"}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.Listen != "0.0.0.0:8000" || s.RouterPolicy != "round-robin" || s.MaxBodyBytes != 32<<20 ||
		s.EmbeddedEtcdListen != "127.0.0.1:2379" || s.EmbeddedEtcdDir != filepath.Join("/var/lib/x", "infera", "etcd") {
		t.Fatalf("defaults: %+v", s)
	}
}

func TestServeEnvAndFlags(t *testing.T) {
	t.Setenv("INFERA_ROUTER_POLICY", "least-load")
	t.Setenv("INFERA_LISTEN", "127.0.0.1:9000")
	s := parseServe(t, "--listen", "127.0.0.1:0", "--etcd-endpoints", "a:2379,b:2379")
	if s.RouterPolicy != "least-load" || s.Listen != "127.0.0.1:0" || len(s.Etcd.Endpoints) != 2 {
		t.Fatalf("flag > env > default broken: %+v", s)
	}
}

func TestServeValidateReportsEverything(t *testing.T) {
	s := parseServe(t, "--listen", "nope", "--router-policy", "magic", "--max-body-bytes", "0",
		"--upstream-timeout", "0s", "--max-conns-per-worker", "-1", "--embedded-etcd-listen", "x:99999",
		"--embedded-etcd-dir", "", "--log-level", "loud")
	s.KnownPolicies = []string{"least-load", "round-robin"}
	err := s.Validate()
	if !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("Validate = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"--listen", "--router-policy \"magic\"", "--max-body-bytes", "--upstream-timeout",
		"--max-conns-per-worker", "--embedded-etcd-listen", "--embedded-etcd-dir", "--log-level"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %s: %v", want, err)
		}
	}
	// With an etcd cluster given, the embedded etcd settings do not matter.
	s = parseServe(t, "--etcd-endpoints", "h:2379", "--embedded-etcd-dir", "")
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestServeKVFlags(t *testing.T) {
	s := parseServe(t)
	k := s.KV
	if k.Tokenizer != "" || k.OverlapWeight != 4 || k.PrefillOverlapWeight != 4 || k.DecodeOverlapWeight != 4 ||
		k.BlockSize != 16 || k.IndexMaxBlocks != 4<<20 || k.RecentDecay <= 0 || k.ApproxTTL <= 0 || k.ApproxMaxBlocks <= 0 || k.Cost != "ttft" {
		t.Fatalf("kv defaults: %+v", k)
	}
	// The per-role weights follow --kv-overlap-weight unless set.
	t.Setenv("INFERA_KV_DECODE_OVERLAP_WEIGHT", "0.25")
	s = parseServe(t, "--kv-overlap-weight", "2", "--tokenizer", "bytes", "--kv-cost", "blocks")
	if s.KV.Cost != "blocks" || s.KV.OverlapWeight != 2 || s.KV.PrefillOverlapWeight != 2 || s.KV.DecodeOverlapWeight != 0.25 || s.KV.Tokenizer != "bytes" {
		t.Fatalf("kv weights: %+v", s.KV)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	s = parseServe(t, "--tokenizer", t.TempDir(), "--kv-overlap-weight", "-1", "--kv-block-size", "0",
		"--kv-index-max-blocks", "0", "--kv-approx-ttl", "0s", "--kv-recent-decay", "-1s", "--kv-approx-max-blocks", "0",
		"--kv-max-share", "0.5", "--kv-provisional-ttl", "-1s", "--kv-rebuild-after", "-1s", "--kv-cost", "fastest")
	err := s.Validate()
	for _, want := range []string{"--tokenizer", "--kv-overlap-weight", "--kv-block-size", "--kv-index-max-blocks",
		"--kv-approx-ttl", "--kv-recent-decay", "--kv-approx-max-blocks", "--kv-max-share", "--kv-provisional-ttl", "--kv-rebuild-after", "--kv-cost"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %s: %v", want, err)
		}
	}
}

func TestServeResilienceAndSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("# team a\nkey-a\n\n  key-b  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("INFERA_API_KEYS", "env-1,env-2")
	s := parseServe(t, "--api-keys-file", keys, "--request-max-retries", "2", "--max-inflight-per-worker", "8",
		"--ttft-timeout", "2s", "--admin-listen", "127.0.0.1:0", "--admin-token", "adm")
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.Keys(), ","); got != "env-1,env-2,key-a,key-b" {
		t.Fatalf("keys %q", got)
	}
	if s.RequestMaxRetries != 2 || s.MaxInflightPerWorker != 8 || s.TTFTTimeout.String() != "2s" ||
		s.BreakerFailureThreshold != 3 || s.BreakerCooldown.String() != "5s" || s.BreakerMaxCooldown.String() != "1m0s" ||
		s.QueueTimeout.String() != "5s" || s.StreamIdleTimeout.String() != "30s" || s.RequestTimeout.String() != "10m0s" ||
		s.HeartbeatInterval.String() != "1s" || s.MaxHeaderBytes != 16384 || s.MaxConnections != 10000 || s.LogPrompts {
		t.Fatalf("values: %+v", s)
	}

	bad := parseServe(t, "--api-keys-file", filepath.Join(dir, "missing"), "--api-keys", "has space",
		"--request-max-retries", "-1", "--breaker-failure-threshold", "0", "--breaker-max-cooldown", "1s",
		"--max-inflight-per-worker", "-2", "--heartbeat-interval", "0s", "--admin-listen", "nope",
		"--max-header-bytes", "10", "--max-connections", "0")
	err := bad.Validate()
	for _, want := range []string{"--api-keys-file", "API key #", "--request-max-retries", "--breaker-failure-threshold",
		"--breaker-max-cooldown", "--max-inflight-per-worker", "--heartbeat-interval", "--admin-listen", "--max-header-bytes", "--max-connections"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %s: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "has space") {
		t.Fatal("a key was echoed in an error")
	}
}

// TestDefaultServeIsParsedDefaults: DefaultServe, which the router's and
// the kv-aware policy's defaults come from, is exactly what an empty
// command line parses to.
func TestDefaultServeIsParsedDefaults(t *testing.T) {
	if got, want := config.DefaultServe(), parseServe(t); !reflect.DeepEqual(got, want) {
		t.Fatalf("DefaultServe() = %+v\nparsed defaults %+v", got, want)
	}
}

// TestServeEnableProfiling: off by default, INFERA_ENABLE_PROFILING turns
// it on, and it needs --admin-listen (profiles never on the client address).
func TestServeEnableProfiling(t *testing.T) {
	if s := parseServe(t); s.EnableProfiling {
		t.Fatal("profiling on by default")
	}
	t.Setenv("INFERA_ENABLE_PROFILING", "true")
	s := parseServe(t, "--admin-listen", "127.0.0.1:0")
	if !s.EnableProfiling {
		t.Fatal("INFERA_ENABLE_PROFILING=true did not enable profiling")
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	bare := parseServe(t)
	if err := bare.Validate(); err == nil || !strings.Contains(err.Error(), "--enable-profiling needs --admin-listen") {
		t.Fatalf("profiling without --admin-listen: %v", err)
	}
}

// TestServeRequestTransport: serve's --request-transport and nats-req-*
// flags share the worker's names, variables and defaults.
func TestServeRequestTransport(t *testing.T) {
	s := parseServe(t)
	if r := s.Requests; r.Transport != config.RequestTransportHTTP || r.IdleTimeout != 900*time.Second || r.MaxDuration != 0 || r.MaxPending != 0 {
		t.Fatalf("defaults %+v", r)
	}
	t.Setenv("INFERA_NATS_REQ_MAX_PENDING", "8")
	t.Setenv("INFERA_NATS_REQ_IDLE_TIMEOUT", "0")
	t.Setenv("NATS_SERVER", "nats://10.0.0.1:4222")
	s = parseServe(t, "--request-transport", "nats", "--nats-req-max-duration", "1h")
	s.KnownPolicies = []string{"round-robin"}
	if r := s.Requests; r.Transport != config.RequestTransportNATS || r.IdleTimeout != 0 || r.MaxDuration != time.Hour || r.MaxPending != 8 ||
		s.KV.NATS.URL != "nats://10.0.0.1:4222" {
		t.Fatalf("flags and variables: %+v %q", r, s.KV.NATS.URL)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	s = parseServe(t, "--request-transport", "grpc", "--nats-req-max-pending", "-1")
	s.KnownPolicies = []string{"round-robin"}
	err := s.Validate()
	for _, want := range []string{"--request-transport \"grpc\"", "--nats-req-max-pending"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %s: %v", want, err)
		}
	}
}
