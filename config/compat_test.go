package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

func parseServeInternal(t *testing.T, args ...string) Serve {
	t.Helper()
	var s Serve
	app := &cli.App{Flags: s.Flags(), Action: func(c *cli.Context) error { s.Finish(c); return nil }}
	if err := app.Run(append([]string{"serve"}, args...)); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return s
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30": 30 * time.Second, "2.5": 2500 * time.Millisecond, "0": 0, " 5 ": 5 * time.Second,
		"30s": 30 * time.Second, "1m30s": 90 * time.Second, "250ms": 250 * time.Millisecond, "-1": -time.Second,
	} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "30 s", "NaN", "Inf", "1e300", "5d"} {
		if _, err := ParseDuration(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseDuration(%q) err = %v, want ErrInvalid", in, err)
		}
	}
}

// Every alias of docs/operations.md's mapping table sets the same field as
// our own flag, from the command line and from the environment.
func TestInferaServeAliases(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(s Serve) bool
	}{
		{"--host --port", []string{"--host", "127.0.0.1", "--port", "9001"}, nil, func(s Serve) bool { return s.Listen == "127.0.0.1:9001" }},
		{"--port only", []string{"--port", "9002"}, nil, func(s Serve) bool { return s.Listen == "0.0.0.0:9002" }},
		{"INFERA_HOST", nil, map[string]string{"INFERA_HOST": "::1"}, func(s Serve) bool { return s.Listen == "[::1]:8000" }},
		{"--listen wins", []string{"--listen", "127.0.0.1:7000", "--port", "9003"}, nil, func(s Serve) bool { return s.Listen == "127.0.0.1:7000" }},
		{"--etcd-endpoint", []string{"--etcd-endpoint", "e:2379"}, nil, func(s Serve) bool { return slices.Equal(s.Etcd.Endpoints, []string{"e:2379"}) }},
		{"INFERA_ETCD_ENDPOINT", nil, map[string]string{"INFERA_ETCD_ENDPOINT": "f:2379"}, func(s Serve) bool { return slices.Equal(s.Etcd.Endpoints, []string{"f:2379"}) }},
		{"--etcd-prefix without /", []string{"--etcd-prefix", "/fleet/a"}, nil, func(s Serve) bool { return s.Etcd.Prefix == "/fleet/a/" }},
		{"--breaker-cooldown-s", []string{"--breaker-cooldown-s", "7.5"}, nil, func(s Serve) bool { return s.BreakerCooldown == 7500*time.Millisecond }},
		{"INFERA_BREAKER_COOLDOWN_S", nil, map[string]string{"INFERA_BREAKER_COOLDOWN_S": "9"}, func(s Serve) bool { return s.BreakerCooldown == 9*time.Second }},
		{"--breaker-max-cooldown-s", []string{"--breaker-max-cooldown-s", "120"}, nil, func(s Serve) bool { return s.BreakerMaxCooldown == 2*time.Minute }},
		{"INFERA_BREAKER_MAX_COOLDOWN_S", nil, map[string]string{"INFERA_BREAKER_MAX_COOLDOWN_S": "90"}, func(s Serve) bool { return s.BreakerMaxCooldown == 90*time.Second }},
		{"--router-tokenizer-path", []string{"--router-tokenizer-path", "/models/q"}, nil, func(s Serve) bool { return s.KV.Tokenizer == "/models/q" }},
		{"INFERA_ROUTER_TOKENIZER_PATH", nil, map[string]string{"INFERA_ROUTER_TOKENIZER_PATH": "bytes"}, func(s Serve) bool { return s.KV.Tokenizer == "bytes" }},
		{"INFERA_REQUEST_MAX_RETRIES", nil, map[string]string{"INFERA_REQUEST_MAX_RETRIES": "3"}, func(s Serve) bool { return s.RequestMaxRetries == 3 }},
		{"INFERA_BREAKER_FAILURE_THRESHOLD", nil, map[string]string{"INFERA_BREAKER_FAILURE_THRESHOLD": "5"}, func(s Serve) bool { return s.BreakerFailureThreshold == 5 }},
		{"--kv-prefill-overlap-weight", []string{"--router-policy", "kv-aware", "--kv-prefill-overlap-weight", "2"}, nil,
			func(s Serve) bool { return s.RouterPolicy == "kv-aware" && s.KV.PrefillOverlapWeight == 2 }},
		{"bare seconds", []string{"--request-timeout", "600"}, map[string]string{"INFERA_QUEUE_TIMEOUT": "2"},
			func(s Serve) bool { return s.RequestTimeout == 10*time.Minute && s.QueueTimeout == 2*time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			s := parseServeInternal(t, tt.args...)
			if !tt.check(s) {
				t.Fatalf("%+v", s)
			}
		})
	}
	// Ours beat Infera's when both are in the environment.
	t.Setenv("INFERA_BREAKER_COOLDOWN", "1s")
	t.Setenv("INFERA_BREAKER_COOLDOWN_S", "9")
	if s := parseServeInternal(t); s.BreakerCooldown != time.Second {
		t.Fatalf("INFERA_BREAKER_COOLDOWN lost to INFERA_BREAKER_COOLDOWN_S: %v", s.BreakerCooldown)
	}
}

func TestInferaWorkerAliases(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(w Worker) bool
	}{
		{"INFERA_DRAIN_TIMEOUT=30", nil, map[string]string{"INFERA_DRAIN_TIMEOUT": "30"}, func(w Worker) bool { return w.DrainTimeout == 30*time.Second }},
		{"--drain-timeout 12.5", []string{"--drain-timeout", "12.5"}, nil, func(w Worker) bool { return w.DrainTimeout == 12500*time.Millisecond }},
		{"INFERA_ENGINE_READY_TIMEOUT", nil, map[string]string{"INFERA_ENGINE_READY_TIMEOUT": "1800"}, func(w Worker) bool { return w.ReadyTimeout == 30*time.Minute }},
		{"INFERA_ATOM_READY_TIMEOUT", nil, map[string]string{"INFERA_ATOM_READY_TIMEOUT": "60"}, func(w Worker) bool { return w.ReadyTimeout == time.Minute }},
		{"--enable-kv-events default", nil, nil, func(w Worker) bool { return !w.NoKVEvents }},
		{"--enable-kv-events", []string{"--enable-kv-events"}, nil, func(w Worker) bool { return !w.NoKVEvents }},
		{"--enable-kv-events=false", []string{"--enable-kv-events=false"}, nil, func(w Worker) bool { return w.NoKVEvents }},
		{"INFERA_ENABLE_KV_EVENTS=false", nil, map[string]string{"INFERA_ENABLE_KV_EVENTS": "false"}, func(w Worker) bool { return w.NoKVEvents }},
		{"--no-enable-kv-events", []string{"--no-enable-kv-events"}, nil, func(w Worker) bool { return w.NoKVEvents }},
		{"--no-kv-events wins", []string{"--no-kv-events", "--enable-kv-events"}, nil, func(w Worker) bool { return w.NoKVEvents }},
		{"--etcd-endpoint", []string{"--etcd-endpoint", "10.0.0.1:2379"}, nil, func(w Worker) bool { return slices.Equal(w.Etcd.Endpoints, []string{"10.0.0.1:2379"}) }},
		{"--etcd-prefix", []string{"--etcd-prefix", "/x"}, nil, func(w Worker) bool { return w.Etcd.Prefix == "/x/" }},
		{"--advertise-host", []string{"--advertise-host", "10.1.2.3"}, nil, func(w Worker) bool { return w.AdvertiseHost == "10.1.2.3" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			w := parseWorker(t, tt.args...)
			if !tt.check(w) {
				t.Fatalf("%+v", w)
			}
			w.Engine = "sim"
			if err := w.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A bad duration is a parse error naming the flag, not a silent default.
func TestDurationFlagRejectsGarbage(t *testing.T) {
	var w Worker
	app := &cli.App{Flags: w.Flags(), Action: func(*cli.Context) error { return nil }}
	app.Writer, app.ErrWriter = discard{}, discard{}
	if err := app.Run([]string{"worker", "--drain-timeout", "soon"}); err == nil {
		t.Fatal("--drain-timeout soon accepted")
	}
	t.Setenv("INFERA_DRAIN_TIMEOUT", "soon")
	if err := app.Run([]string{"worker"}); err == nil {
		t.Fatal("INFERA_DRAIN_TIMEOUT=soon accepted")
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// ParseDuration reads environment variables and flags: any input either
// parses or fails with ErrInvalid, and a Go duration reads as Go reads it.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"30", "2.5", "1m30s", "-1", "1e300", "NaN", "", "0x10", "1_000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if g, gerr := time.ParseDuration(strings.TrimSpace(s)); gerr == nil && g != d {
			t.Fatalf("ParseDuration(%q) = %v, time.ParseDuration = %v", s, d, g)
		}
	})
}
