package main

import (
	"bytes"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

func TestParseSimArgs(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c *config.Sim)
		ignored []string
		err     string
	}{
		{
			name: "native flags",
			args: []string{"--port", "0", "--time-scale", "0", "--model", "m", "--kv-events-endpoint", "tcp://*:0"},
			check: func(t *testing.T, c *config.Sim) {
				if c.Port != 0 || c.TimeScale != 0 || c.Model != "m" || c.KVEventsEndpoint != "tcp://*:0" || c.Flavor != "" {
					t.Errorf("%+v", c)
				}
			},
		},
		{
			name: "vllm facade after sim flags",
			args: []string{"--time-scale", "0.5", "--flavor", "vllm", "serve", "Qwen/Qwen3-8B", "--port", "8001",
				"--tensor-parallel-size", "2", "--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557"}`},
			check: func(t *testing.T, c *config.Sim) {
				if c.TimeScale != 0.5 || c.Port != 8001 || c.Model != "Qwen/Qwen3-8B" || c.Host != "0.0.0.0" ||
					c.KVEventsEndpoint != "tcp://*:5557" || c.KVEventsFormat != config.KVFormatVLLMArray {
					t.Errorf("%+v", c)
				}
			},
			ignored: []string{"--tensor-parallel-size", "2"},
		},
		{
			name: "sglang facade: engine flags that clash with sim flag names belong to the engine",
			args: []string{"--flavor=sglang", "--model-path", "m", "--port", "30005", "--seed", "x"},
			check: func(t *testing.T, c *config.Sim) {
				if c.Port != 30005 || c.Host != "127.0.0.1" || c.BlockSize != 1 || c.Model != "m" {
					t.Errorf("%+v", c)
				}
			},
			ignored: []string{"--seed", "x"},
		},
		{
			name: "explicit sim flags and environment beat engine defaults",
			args: []string{"--host", "127.0.0.2", "--flavor", "atom", "--model", "m"},
			env:  map[string]string{"INFERA_PORT": "9100"},
			check: func(t *testing.T, c *config.Sim) {
				if c.Port != 9100 || c.Host != "127.0.0.2" {
					t.Errorf("%+v", c)
				}
			},
		},
		{name: "help", args: []string{"--port", "1", "--help"}, err: "help requested"},
		{name: "unknown sim flag", args: []string{"--bogus"}, err: "not defined"},
		{name: "stray argument", args: []string{"--port", "1", "serve"}, err: "unexpected argument"},
		{name: "flavor without value", args: []string{"--flavor"}, err: "needs an argument"},
		{name: "unknown flavor", args: []string{"--flavor", "tgi", "x"}, err: "unknown flavor"},
		{name: "engine args error", args: []string{"--flavor", "vllm", "serve"}, err: "no model"},
		{name: "flavor from env only", args: nil, env: map[string]string{"INFERA_FLAVOR": "vllm"}, err: "--flavor"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var cfg config.Sim
			flags := cfg.Flags()
			ignored, err := parseSimArgs(&cfg, flags, tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				if !errors.Is(err, flag.ErrHelp) && !errors.Is(err, config.ErrInvalid) {
					t.Errorf("err %v does not wrap config.ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			tc.check(t, &cfg)
			for _, a := range tc.ignored {
				if !slices.Contains(ignored, a) {
					t.Errorf("%q not reported as ignored in %q", a, ignored)
				}
			}
		})
	}
}

func TestSimCommandHelpAndUsageErrors(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"infera", "sim", "--help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "--flavor") {
		t.Errorf("help: code %d\n%s%s", code, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"infera", "sim", "--flavor", "vllm", "serve"}, &out, &errOut); code != exitConfig {
		t.Errorf("facade error: code %d, %s", code, errOut.String())
	}
}
