package engines

import (
	"errors"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

func TestLookup(t *testing.T) {
	a, err := Lookup("sim")
	if err != nil || a.Name() != "sim" {
		t.Fatalf("Lookup(sim) = %v, %v", a, err)
	}
	_, err = Lookup("tgi")
	if !errors.Is(err, ErrUnknownEngine) || !strings.Contains(err.Error(), "sim") {
		t.Fatalf("Lookup(tgi) = %v, want ErrUnknownEngine listing the supported engines", err)
	}
	// config validates --engine against its own list; the two must agree.
	if !slices.Equal(Names(), config.WorkerEngines) {
		t.Fatalf("adapters %v differ from config.WorkerEngines %v", Names(), config.WorkerEngines)
	}
}

func TestSimPrepare(t *testing.T) {
	cases := []struct {
		name      string
		args      []string
		env       map[string]string
		wantArgs  []string // nil: the sim args are ["sim", "--port", <free>, args...]; "PORT" stands for the picked port
		want      Endpoint // Port 0: a free port is expected
		wantError bool
	}{
		{name: "defaults", args: nil, want: Endpoint{Host: "127.0.0.1", Model: "sim-model", BlockSize: 16}},
		{
			name:     "all given",
			args:     []string{"--host", "127.0.0.1", "--port", "9100", "--model", "m", "--block-size", "32", "--kv-blocks", "64"},
			wantArgs: []string{"sim", "--host", "127.0.0.1", "--port", "9100", "--model", "m", "--block-size", "32", "--kv-blocks", "64"},
			want:     Endpoint{Host: "127.0.0.1", Port: 9100, Model: "m", BlockSize: 32},
		},
		{
			name:     "equals form",
			args:     []string{"--port=9101", "--model=path/to/m", "--block-size=8", "--host=localhost"},
			wantArgs: []string{"sim", "--port=9101", "--model=path/to/m", "--block-size=8", "--host=localhost"},
			want:     Endpoint{Host: "localhost", Port: 9101, Model: "path/to/m", BlockSize: 8},
		},
		{
			name:     "single dash",
			args:     []string{"-port", "9102", "-model", "x"},
			wantArgs: []string{"sim", "-port", "9102", "-model", "x"},
			want:     Endpoint{Host: "127.0.0.1", Port: 9102, Model: "x", BlockSize: 16},
		},
		{
			name: "served name wins over model",
			args: []string{"--served-model-name", "public", "--model", "/models/llama"},
			want: Endpoint{Host: "127.0.0.1", Model: "public", BlockSize: 16},
		},
		{
			name: "last occurrence wins",
			args: []string{"--model", "a", "--model=b"},
			want: Endpoint{Host: "127.0.0.1", Model: "b", BlockSize: 16},
		},
		{
			name: "after -- is not parsed",
			args: []string{"--model", "a", "--", "--port", "1"},
			want: Endpoint{Host: "127.0.0.1", Model: "a", BlockSize: 16},
		},
		{
			name: "value that looks like a flag name",
			args: []string{"--model", "--port"},
			want: Endpoint{Host: "127.0.0.1", Model: "--port", BlockSize: 16},
		},
		{
			name:     "environment as the sim reads it",
			env:      map[string]string{"INFERA_MODEL": "env-model", "INFERA_BLOCK_SIZE": "8", "INFERA_PORT": "9103", "INFERA_HOST": ""},
			wantArgs: []string{"sim", "--port", "9103"},
			want:     Endpoint{Host: "127.0.0.1", Port: 9103, Model: "env-model", BlockSize: 8},
		},
		{
			name:     "flags beat the environment",
			args:     []string{"--model", "flag-model", "--port", "9104"},
			env:      map[string]string{"INFERA_MODEL": "env-model", "INFERA_PORT": "9103"},
			wantArgs: []string{"sim", "--model", "flag-model", "--port", "9104"},
			want:     Endpoint{Host: "127.0.0.1", Port: 9104, Model: "flag-model", BlockSize: 16},
		},
		{name: "port 0 in the environment", env: map[string]string{"INFERA_PORT": "0"}, want: Endpoint{Host: "127.0.0.1", Model: "sim-model", BlockSize: 16}},
		{name: "bad port in the environment", env: map[string]string{"INFERA_PORT": "x"}, wantError: true},
		{
			name:     "port 0 replaced",
			args:     []string{"--model", "m", "--port", "0", "--", "--port", "0"},
			wantArgs: []string{"sim", "--model", "m", "--port", "PORT", "--", "--port", "0"},
			want:     Endpoint{Host: "127.0.0.1", Model: "m", BlockSize: 16},
		},
		{
			name:     "port=0 replaced",
			args:     []string{"-port=0", "--model", "m"},
			wantArgs: []string{"sim", "-port=PORT", "--model", "m"},
			want:     Endpoint{Host: "127.0.0.1", Model: "m", BlockSize: 16},
		},
		{name: "negative port", args: []string{"--port", "-1"}, wantError: true},
		{name: "port out of range", args: []string{"--port=70000"}, wantError: true},
		{name: "port not a number", args: []string{"--port", "http"}, wantError: true},
		{name: "flag without value", args: []string{"--model", "m", "--host"}, wantError: true},
		{name: "bad host", args: []string{"--host", "http://x"}, wantError: true},
		{name: "bad block size", args: []string{"--block-size", "0"}, wantError: true},
		{name: "empty model", args: []string{"--served-model-name="}, wantError: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			// The KV-event flags the worker adds are TestSimEvents's business.
			l, err := simAdapter{}.Prepare(Options{Bin: "/opt/infera", LookupEnv: lookup, NoKVEvents: true}, tc.args)
			if tc.wantError {
				if !errors.Is(err, ErrEngineArgs) {
					t.Fatalf("Prepare = %+v, %v; want ErrEngineArgs", l, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.Command.Path != "/opt/infera" || l.Command.Name != "sim" {
				t.Errorf("command %+v: want /opt/infera named sim", l.Command)
			}
			want, wantArgs := tc.want, tc.wantArgs
			if want.Port == 0 {
				// The worker picked a port and put it before the user's args.
				if l.Endpoint.Port == 0 {
					t.Fatal("no port picked")
				}
				want.Port = l.Endpoint.Port
				if wantArgs == nil {
					wantArgs = append([]string{"sim", "--port", "PORT"}, tc.args...)
				}
				wantArgs = slices.Clone(wantArgs)
				for i, a := range wantArgs {
					wantArgs[i] = strings.ReplaceAll(a, "PORT", strconv.Itoa(want.Port))
				}
				// The picked port is free to bind on the engine host.
				ln, err := net.Listen("tcp", net.JoinHostPort(want.Host, strconv.Itoa(want.Port)))
				if err != nil {
					t.Fatalf("picked port is not bindable: %v", err)
				}
				ln.Close()
			}
			want.AdvertiseHost, want.DPSize, want.Imitates = want.Host, 1, "vllm" // no --flavor: the sim imitates vLLM
			if !reflect.DeepEqual(l.Endpoint, want) {
				t.Errorf("endpoint %+v, want %+v", l.Endpoint, want)
			}
			if !slices.Equal(l.Command.Args, wantArgs) {
				t.Errorf("args %q, want %q", l.Command.Args, wantArgs)
			}
		})
	}
}

func TestSimPrepareDefaultBin(t *testing.T) {
	l, err := simAdapter{}.Prepare(Options{}, []string{"--port", "9100"})
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if l.Command.Path != exe {
		t.Fatalf("path %q, want this executable %q", l.Command.Path, exe)
	}
}

// vllmMetrics is /metrics text in the shape vLLM serves (HELP/TYPE lines,
// model_name and engine labels, several DP engines, histograms around).
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 0.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 1024.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 0.12
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27008"} 1.0
`

func TestSimInspect(t *testing.T) {
	cases := []struct {
		name      string
		text      string
		want      Stats
		wantError bool
	}{
		{name: "vllm busy", text: vllmMetrics, want: Stats{Running: 3, Waiting: 4, BlockSize: 16, KVBlocks: 27008}},
		{
			// An absurd cache size is left unknown rather than registered
			// (a router would reject the record).
			name: "cache size beyond what a router accepts",
			text: "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n" +
				"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2147483648\"} 1.0\n",
			want: Stats{BlockSize: 16},
		},
		{
			name: "idle, no cache info",
			text: "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n",
			want: Stats{},
		},
		{
			name: "untyped",
			text: "vllm:num_requests_running{a=\"1\"} 1\nvllm:num_requests_waiting 0\n",
			want: Stats{Running: 1},
		},
		{name: "gauges missing", text: "# TYPE other gauge\nother 1\n", wantError: true},
		{name: "waiting missing", text: "vllm:num_requests_running 0\n", wantError: true},
		{name: "not prometheus", text: "<html>oops</html>\n", wantError: true},
		{name: "empty", text: "", wantError: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := simAdapter{}.Inspect(strings.NewReader(tc.text))
			if tc.wantError {
				if !errors.Is(err, ErrMetrics) {
					t.Fatalf("Inspect = %+v, %v; want ErrMetrics", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("Inspect = %+v, want %+v", got, tc.want)
			}
			if got.Idle() != (tc.want.Running+tc.want.Waiting == 0) {
				t.Fatalf("Idle() = %v for %+v", got.Idle(), got)
			}
		})
	}
}

const sglangMetrics = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="deepseek-ai/DeepSeek-V3",tp_rank="0",dp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="deepseek-ai/DeepSeek-V3",tp_rank="0",dp_rank="1"} 1.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="deepseek-ai/DeepSeek-V3",tp_rank="0",dp_rank="0"} 2.0
# HELP sglang:num_prefill_inflight_queue_reqs The number of requests in the prefill inflight queue.
# TYPE sglang:num_prefill_inflight_queue_reqs gauge
sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",model_name="deepseek-ai/DeepSeek-V3",tp_rank="0"} 5.0
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="deepseek-ai/DeepSeek-V3"} 1234.5
`

const atomMetrics = `# HELP atom:requests_running Number of requests currently running across data-parallel ranks.
# TYPE atom:requests_running gauge
atom:requests_running 2.0
# HELP atom:requests_waiting Number of requests waiting across data-parallel ranks.
# TYPE atom:requests_waiting gauge
atom:requests_waiting 1.0
# HELP atom:cache_config_info KV-cache geometry of this engine.
# TYPE atom:cache_config_info gauge
atom:cache_config_info{block_size="16",num_gpu_blocks="40000"} 1.0
`

func TestEngineInspect(t *testing.T) {
	cases := []struct {
		engine, text string
		want         Stats
		wantError    bool
	}{
		{engine: "sglang", text: sglangMetrics, want: Stats{Running: 4, Waiting: 7}},
		{engine: "sglang", text: "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n", wantError: true},
		{engine: "sglang", text: vllmMetrics, wantError: true},
		{engine: "atom", text: atomMetrics, want: Stats{Running: 2, Waiting: 1, BlockSize: 16, KVBlocks: 40000}},
		// The simulator's ATOM facade (and older ATOM builds) speak vLLM's names.
		{engine: "atom", text: vllmMetrics, want: Stats{Running: 3, Waiting: 4, BlockSize: 16, KVBlocks: 27008}},
		{engine: "atom", text: "atom:requests_running 1\n", wantError: true},
		{engine: "vllm", text: vllmMetrics, want: Stats{Running: 3, Waiting: 4, BlockSize: 16, KVBlocks: 27008}},
		{engine: "vllm", text: "vllm:num_requests_running 0\n", wantError: true},
	}
	for _, tc := range cases {
		a, err := Lookup(tc.engine)
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.Inspect(strings.NewReader(tc.text))
		if tc.wantError {
			if !errors.Is(err, ErrMetrics) {
				t.Errorf("%s: Inspect = %+v, %v; want ErrMetrics", tc.engine, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: Inspect = %+v, %v; want %+v", tc.engine, got, err, tc.want)
		}
	}
}

func TestSGLangServerInfoPageSize(t *testing.T) {
	p := sglangAdapter{}
	type sizes struct{ page, blocks int }
	for body, want := range map[string]sizes{
		`{"page_size": 64, "model_path": "m"}`:                               {64, 0},
		`{"server_args": {"page_size": 1}, "version": "x"}`:                  {1, 0},
		`{"page_size": 32, "server_args": {"page_size": 1}}`:                 {32, 0},
		`{"page_size": 16, "max_total_num_tokens": 270336}`:                  {16, 16896},
		`{"page_size": 16, "max_total_num_tokens": 270340}`:                  {16, 16896},
		`{"server_args": {"page_size": 128}, "max_total_num_tokens": 65536}`: {128, 512},
		`{"page_size": 16, "max_total_num_tokens": 0}`:                       {16, 0},
		`{"page_size": 16, "max_total_num_tokens": -4096}`:                   {16, 0},
		`{"page_size": 16, "max_total_num_tokens": 8}`:                       {16, 0},
		`{"page_size": 1, "max_total_num_tokens": 2147483648}`:               {1, 0},
		`{"page_size": 16, "max_total_num_tokens": "4096"}`:                  {16, 0},
		`{"page_size": 16, "max_total_num_tokens": 1e400}`:                   {16, 0},
		`{"page_size": 16, "max_total_num_tokens": 4096.0}`:                  {16, 256},
	} {
		page, blocks, err := p.parseBlockSize(strings.NewReader(body))
		if err != nil || page != want.page || blocks != want.blocks {
			t.Errorf("parseBlockSize(%s) = %d, %d, %v; want %d, %d", body, page, blocks, err, want.page, want.blocks)
		}
	}
	for _, body := range []string{`{"page_size": null}`, `{"page_size": 0}`, `{}`, `<html>`, `{"page_size": "64"}`} {
		if got, _, err := p.parseBlockSize(strings.NewReader(body)); err == nil {
			t.Errorf("parseBlockSize(%s) = %d, want an error", body, got)
		}
	}
	if p.blockSizePath() != "/get_server_info" {
		t.Errorf("path %q", p.blockSizePath())
	}
}
