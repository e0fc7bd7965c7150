package sim

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testkit"
)

func TestApplyFacade(t *testing.T) {
	tokDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(tokDir, "tokenizer.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	const events = `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}`
	type want struct {
		model, served, host, tokenizer string
		port, block, maxLen, kvBlocks  int
		endpoint, replay, topic        string
		format                         string
		dpRank                         int
	}
	cases := []struct {
		name     string
		flavor   string
		args     []string
		explicit []string
		edit     func(*config.Sim) // sim flags set before --flavor
		want     want
		ignored  []string // must all be reported
		err      string
	}{
		{
			name:   "vllm docs line",
			flavor: config.FlavorVLLM,
			args: []string{"serve", "Qwen/Qwen3-8B", "--tensor-parallel-size", "8", "--port", "8001",
				"--served-model-name", "qwen", "qwen-alias", "--block-size", "32", "--max-model-len", "32k",
				"--enable-prefix-caching", "--gpu-memory-utilization", "0.9", "--kv-events-config", events},
			want: want{model: "Qwen/Qwen3-8B", served: "qwen", host: "0.0.0.0", port: 8001, block: 32, maxLen: 32000,
				kvBlocks: 2048, endpoint: "tcp://*:5557", replay: "tcp://*:5558", topic: "kv-events",
				format: config.KVFormatVLLMArray},
			ignored: []string{"--tensor-parallel-size", "8", "--enable-prefix-caching", "--gpu-memory-utilization", "0.9"},
		},
		{
			name:   "vllm data-parallel rank offsets both sockets",
			flavor: config.FlavorVLLM,
			args:   []string{"serve", "m", "--data-parallel-size", "4", "--data-parallel-rank", "2", "--kv-events-config=" + events},
			want: want{model: "m", host: "0.0.0.0", port: 8000, block: 16, maxLen: 8192, kvBlocks: 4096,
				endpoint: "tcp://*:5559", replay: "tcp://*:5560", topic: "kv-events", format: config.KVFormatVLLMArray,
				dpRank: 2},
			ignored: []string{"--data-parallel-size", "4"},
		},
		{
			name:   "vllm dotted keys, --model, underscores",
			flavor: config.FlavorVLLM,
			args: []string{"serve", "--model", "m", "--max_model_len=4096", "--kv-events-config.enable_kv_cache_events", "true",
				"--kv-events-config.endpoint", "tcp://*:6000", "--seed", "-3"},
			want: want{model: "m", host: "0.0.0.0", port: 8000, block: 16, maxLen: 4096, kvBlocks: 4096,
				endpoint: "tcp://*:6000", format: config.KVFormatVLLMArray},
		},
		{
			name:   "vllm events disabled",
			flavor: config.FlavorVLLM,
			args:   []string{"serve", "m", "--kv-events-config", `{"enable_kv_cache_events":false,"endpoint":"tcp://*:5557"}`},
			want:   want{model: "m", host: "0.0.0.0", port: 8000, block: 16, maxLen: 8192, kvBlocks: 4096, format: config.KVFormatVLLMArray},
		},
		{
			name:     "sim flags before --flavor beat engine defaults",
			flavor:   config.FlavorVLLM,
			args:     []string{"serve", "m"},
			explicit: []string{"port", "host", "kv-events-endpoint", "kv-events-format", "kv-blocks"},
			edit: func(c *config.Sim) {
				c.Port, c.Host, c.KVBlocks = 9000, "127.0.0.1", 600
				c.KVEventsEndpoint, c.KVEventsFormat = "tcp://127.0.0.1:0", config.KVFormatVLLM
			},
			want: want{model: "m", host: "127.0.0.1", port: 9000, block: 16, maxLen: 8192, kvBlocks: 600,
				endpoint: "tcp://127.0.0.1:0", topic: "kv-events", format: config.KVFormatVLLM},
		},
		{
			name:   "vllm model directory with a tokenizer",
			flavor: config.FlavorVLLM,
			args:   []string{"serve", tokDir, "--tokenizer", "org/hub-name"},
			want: want{model: tokDir, host: "0.0.0.0", port: 8000, block: 16, maxLen: 8192, kvBlocks: 4096,
				tokenizer: tokDir, format: config.KVFormatVLLMArray},
		},
		{
			name:   "sglang docs line",
			flavor: config.FlavorSGLang,
			args: []string{"--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--port", "30001", "--page-size", "16",
				"--tp", "2", "--enable-metrics", "--dp-size", "2", "--enable-dp-attention",
				"--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "8998",
				"--kv-events-config", `{"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv"}`},
			want: want{model: "meta-llama/Llama-3.1-8B-Instruct", host: "127.0.0.1", port: 30001, block: 16, maxLen: 8192,
				kvBlocks: 4096, endpoint: "tcp://*:5557", topic: "kv", format: config.KVFormatSGLang},
			ignored: []string{"--tp", "2", "--enable-metrics", "--enable-dp-attention"},
		},
		{
			name:   "sglang defaults: 1-token pages, no publisher means no events",
			flavor: config.FlavorSGLang,
			args:   []string{"--model-path", "m", "--context-length", "16384", "--kv-events-config", `{"endpoint":"tcp://*:5557"}`},
			want: want{model: "m", host: "127.0.0.1", port: 30000, block: 1, maxLen: 16384, kvBlocks: 65536,
				format: config.KVFormatSGLang},
		},
		{
			name:   "atom docs line",
			flavor: config.FlavorATOM,
			args: []string{"--model", "/models/DeepSeek-V3", "--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "70000",
				"-tp", "8", "--server-port", "8888", "--block-size", "16", "--kv_cache_dtype", "fp8", "--port", "29500",
				"--kv-events-config", events},
			want: want{model: "/models/DeepSeek-V3", host: "0.0.0.0", port: 8888, block: 16, maxLen: 8192, kvBlocks: 4096,
				endpoint: "tcp://*:5557", replay: "tcp://*:5558", topic: "kv-events", format: config.KVFormatVLLM},
			ignored: []string{"-tp", "8", "--kv_cache_dtype", "fp8", "--port", "29500"},
		},
		{
			// As argparse (and the worker's engines package): a negative
			// number is a value, so it stays with the unknown flag before it.
			name:    "negative numbers are values of unknown flags",
			flavor:  config.FlavorVLLM,
			args:    []string{"serve", "m", "--some-offset", "-2", "--port", "8002"},
			want:    want{model: "m", host: "0.0.0.0", port: 8002, block: 16, maxLen: 8192, kvBlocks: 4096, format: config.KVFormatVLLMArray},
			ignored: []string{"--some-offset", "-2"},
		},
		{
			// After "--" nothing is a flag: the model comes positionally.
			name:   "vllm model after --",
			flavor: config.FlavorVLLM,
			args:   []string{"serve", "--port", "8003", "--", "m"},
			want:   want{model: "m", host: "0.0.0.0", port: 8003, block: 16, maxLen: 8192, kvBlocks: 4096, format: config.KVFormatVLLMArray},
		},
		{name: "flags after -- are positional", flavor: config.FlavorVLLM, args: []string{"serve", "m", "--", "--port", "1"}, err: "unexpected argument"},
		{name: "sglang positional after --", flavor: config.FlavorSGLang, args: []string{"--model-path", "m", "--", "x"}, err: "unexpected argument"},
		{name: "empty dotted key", flavor: config.FlavorVLLM, args: []string{"serve", "m", "--kv-events-config.", "1"}, err: "empty key"},
		{name: "vllm without a model", flavor: config.FlavorVLLM, args: []string{"serve", "--port", "1"}, err: "no model"},
		{name: "vllm second positional", flavor: config.FlavorVLLM, args: []string{"serve", "m", "extra"}, err: "unexpected argument"},
		{name: "sglang without --model-path", flavor: config.FlavorSGLang, args: []string{"--port", "1"}, err: "--model-path is required"},
		{name: "bad port", flavor: config.FlavorATOM, args: []string{"--model", "m", "--server-port", "http"}, err: "--server-port"},
		{name: "missing value", flavor: config.FlavorATOM, args: []string{"--model"}, err: "needs a value"},
		{name: "events config not JSON", flavor: config.FlavorVLLM, args: []string{"serve", "m", "--kv-events-config", "{"}, err: "JSON"},
		{name: "endpoint not a string", flavor: config.FlavorVLLM, args: []string{"serve", "m", "--kv-events-config",
			`{"enable_kv_cache_events":true,"endpoint":5}`}, err: "want a string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.DefaultSim()
			cfg.Flavor = tc.flavor
			if tc.edit != nil {
				tc.edit(&cfg)
			}
			ignored, err := ApplyFacade(&cfg, tc.args, func(name string) bool { return slices.Contains(tc.explicit, name) })
			if tc.err != "" {
				if err == nil || !errors.Is(err, ErrFacadeArgs) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("resulting config invalid: %v", err)
			}
			w := tc.want
			got := want{model: cfg.Model, served: cfg.ServedModelName, host: cfg.Host, port: cfg.Port, block: cfg.BlockSize,
				maxLen: cfg.MaxModelLen, kvBlocks: cfg.KVBlocks, endpoint: cfg.KVEventsEndpoint, replay: cfg.KVEventsReplayEndpoint,
				topic: cfg.KVEventsTopic, format: cfg.KVEventsFormat, dpRank: cfg.DPRank}
			if w.tokenizer != "" {
				got.tokenizer = cfg.Tokenizer
			} else if cfg.Tokenizer != "bytes" {
				t.Errorf("tokenizer %q", cfg.Tokenizer)
			}
			if w.endpoint == "" {
				w.topic = got.topic // no publisher: the topic does not matter
			}
			if got != w {
				t.Errorf("got  %+v\nwant %+v", got, w)
			}
			for _, a := range tc.ignored {
				if !slices.Contains(ignored, a) {
					t.Errorf("ignored %q not reported in %q", a, ignored)
				}
			}
		})
	}
}

// TestSGLangFlavorServer: an SGLang facade serves SGLang's metric names,
// /get_server_info with its page size, and /flush_cache.
func TestSGLangFlavorServer(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) {
		c.Flavor = config.FlavorSGLang
		c.BlockSize = 4
	})
	ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 3}, "a prompt of some length"))
	m := ts.metrics(t)
	for _, name := range []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate"} {
		d, ok := m[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if d.labels["model_name"] != "sim-model" {
			t.Errorf("%s labels %v", name, d.labels)
		}
	}
	if _, ok := m["vllm:num_requests_running"]; ok {
		t.Error("vLLM names served by the SGLang facade")
	}
	code, body := ts.get(t, "/get_server_info")
	if code != 200 || !strings.Contains(string(body), `"page_size":4`) {
		t.Errorf("/get_server_info %d %s", code, body)
	}
	// The round's counters are published after its answer may have gone
	// out: wait for them rather than read them at once.
	testkit.Eventually(t, "the prompt cached", func() bool { return ts.srv.sched.pub.cached.Load() > 0 })
	if code, _ := ts.post(t, "/flush_cache", ""); code != 200 {
		t.Fatalf("/flush_cache %d", code)
	}
	testkit.Eventually(t, "cache flushed", func() bool { return ts.srv.sched.pub.cached.Load() == 0 })

	plain := startSim(t, nil)
	if code, _ := plain.post(t, "/flush_cache", ""); code != 404 {
		t.Errorf("/flush_cache on the vLLM sim: %d", code)
	}
}

// TestVLLMFacadePublishes: a vLLM command line with --kv-events-config and
// a data-parallel rank drives the publisher end to end.
func TestVLLMFacadePublishes(t *testing.T) {
	r := startEventRig(t, "", func(c *config.Sim) {
		c.Flavor = config.FlavorVLLM
		_, err := ApplyFacade(c, []string{"serve", "sim-model", "--host", "127.0.0.1", "--port", "0", "--block-size", "4",
			"--data-parallel-rank", "1", "--kv-events-config",
			`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","replay_endpoint":"tcp://127.0.0.1:0"}`},
			func(name string) bool { return name == "time-scale" })
		if err != nil {
			t.Fatal(err)
		}
		if c.KVEventsFormat != config.KVFormatVLLMArray || c.DPRank != 1 {
			t.Fatalf("facade config %+v", c)
		}
	})
	r.complete(t, promptTokens(1, 30), 5)
	if st := r.waitSynced(t); st.Blocks == 0 {
		t.Errorf("nothing indexed: %+v", st)
	}
}
