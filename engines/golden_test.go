package engines

import (
	"bytes"
	"encoding/json"
	"flag"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// goldenCase is one `infera worker` invocation as an operator types it.
type goldenCase struct {
	name        string
	engine      string
	workerFlags []string // documentation only: the flags that set opts
	opts        Options
	env         map[string]string
	args        []string
}

// goldenMachine is the machine the golden launches are prepared on: one
// NIC with 10.0.0.5, so engines that bind 0.0.0.0 advertise that.
func goldenMachine() ([]netInterface, error) {
	return []netInterface{
		{Up: true, Loopback: true, Addrs: []net.Addr{&net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)}}},
		{Up: true, Addrs: []net.Addr{&net.IPNet{IP: net.IPv4(10, 0, 0, 5), Mask: net.CIDRMask(24, 32)}}},
	}, nil
}

// seqPorts hands out ports in order from start, so launches are
// reproducible: the first free port asked for is start.
func seqPorts(start int) func(string, int) (int, error) {
	next := start
	return func(_ string, n int) (int, error) {
		p := next
		next += n
		return p, nil
	}
}

var goldenCases = []goldenCase{
	{
		name: "vllm_tp8", engine: "vllm",
		args: []string{"meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "8", "--max-model-len", "32768", "--gpu-memory-utilization", "0.9"},
	},
	{
		name: "vllm_served_name_custom_ports", engine: "vllm",
		args: []string{"Qwen/Qwen3-8B", "--served-model-name", "qwen3", "qwen3-8b", "--host", "10.0.0.5", "--port", "8100", "--block-size", "32",
			"--kv-events-config", `{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}`},
	},
	{
		name: "vllm_dp_external_rank3", engine: "vllm",
		workerFlags: []string{"--advertise-host", "node-3.example"}, opts: Options{AdvertiseHost: "node-3.example"},
		args: []string{"deepseek-ai/DeepSeek-V3", "--tensor-parallel-size", "1", "--data-parallel-size", "8", "--data-parallel-rank", "3",
			"--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345", "--enable-expert-parallel", "--port", "8003", "--trust-remote-code"},
	},
	{
		name: "vllm_dp_internal_4", engine: "vllm",
		args: []string{"Qwen/Qwen3-30B-A3B", "-dp", "4", "--enable-expert-parallel", "--port", "8000"},
	},
	{
		name: "vllm_pd_mooncake_prefill", engine: "vllm",
		env: map[string]string{"VLLM_MOONCAKE_BOOTSTRAP_PORT": "8998", "PYTHONUNBUFFERED": "1"},
		args: []string{"Qwen/Qwen3-8B", "-tp", "8", "--port", "8010", "--trust-remote-code",
			"--kv-transfer-config", `{"kv_connector":"MooncakeConnector","kv_role":"kv_producer","kv_connector_extra_config":{"mooncake_protocol":"rdma"}}`},
	},
	{
		name: "vllm_pd_mooncake_decode", engine: "vllm",
		args: []string{"Qwen/Qwen3-8B", "-tp", "8", "--port", "8020", "--trust-remote-code",
			"--kv-transfer-config", `{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer","kv_connector_extra_config":{"mooncake_protocol":"rdma"}}`},
	},
	{
		name: "vllm_pd_nixl_prefill", engine: "vllm",
		args: []string{"meta-llama/Llama-3.1-8B-Instruct", "--port", "8100", "--enforce-eager", "--block-size", "128",
			"--kv-transfer-config={\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\",\"engine_id\":\"prefill-0\"}"},
	},
	{
		name: "vllm_pd_nixl_decode_dotted", engine: "vllm",
		args: []string{"meta-llama/Llama-3.1-8B-Instruct", "--port", "8200", "--block-size", "128",
			"--kv-transfer-config.kv_connector", "NixlConnector", "--kv-transfer-config.kv_role", "kv_consumer"},
	},
	{
		name: "vllm_pd_mori_read", engine: "vllm",
		args: []string{"Qwen/Qwen3-235B-A22B-FP8", "-tp", "4", "--port", "20005",
			"--kv-transfer-config", `{"kv_connector":"MoRIIOConnector","kv_role":"kv_producer","kv_connector_extra_config":{"proxy_ip":"10.0.0.9","proxy_ping_port":36367,"http_port":20005,"handshake_port":6301,"notify_port":61005,"read_mode":true}}`},
	},
	{
		name: "vllm_no_kv_events_engine_bin", engine: "vllm",
		workerFlags: []string{"--no-kv-events", "--engine-bin", "/opt/vllm/bin/vllm"}, opts: Options{NoKVEvents: true, Bin: "/opt/vllm/bin/vllm"},
		args: []string{"--model", "Qwen/Qwen3-8B", "--host", "127.0.0.1"},
	},
	{
		name: "sglang_dp_attention_8", engine: "sglang",
		args: []string{"--model-path", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--dp", "8", "--enable-dp-attention", "--host", "0.0.0.0", "--port", "30000", "--trust-remote-code"},
	},
	{
		name: "sglang_pd_prefill_bootstrap", engine: "sglang",
		workerFlags: []string{"--python", "/opt/venv/bin/python"}, opts: Options{Python: "/opt/venv/bin/python"},
		args: []string{"--model-path", "deepseek-ai/DeepSeek-V3", "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "9000",
			"--disaggregation-transfer-backend", "mooncake", "--disaggregation-ib-device", "mlx5_0", "--tp", "8", "--page-size", "64",
			"--host", "0.0.0.0", "--port", "30000", "--trust-remote-code"},
	},
	{
		name: "sglang_pd_decode", engine: "sglang",
		args: []string{"--model-path", "deepseek-ai/DeepSeek-V3", "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
			"--tp", "8", "--host", "0.0.0.0", "--port", "30001", "--trust-remote-code"},
	},
	{
		name: "sglang_served_name_defaults", engine: "sglang",
		args: []string{"--model-path", "Qwen/Qwen3-8B", "--served-model-name", "qwen3", "--enable-metrics"},
	},
	{
		name: "sglang_dp_without_attention", engine: "sglang",
		args: []string{"--model-path", "Qwen/Qwen3-8B", "--dp-size", "2", "--host", "0.0.0.0", "--port", "30000"},
	},
	{
		name: "atom_pd_prefill", engine: "atom",
		args: []string{"--model", "deepseek-ai/DeepSeek-R1", "-tp", "8", "--server-port", "8000", "--block-size", "16",
			"--kv-transfer-config", `{"kv_role":"kv_producer","kv_connector":"mooncake","handshake_port":6301}`},
	},
	{
		name: "atom_mixed_defaults", engine: "atom",
		args: []string{"--model", "Qwen/Qwen3-8B", "--kv_cache_dtype", "fp8"},
	},
	{
		name: "sim_defaults", engine: "sim",
		args: []string{"--model", "demo", "--block-size", "16"},
	},
	{
		name: "sim_wildcard_given_endpoint", engine: "sim",
		args: []string{"--host", "0.0.0.0", "--port", "8101", "--kv-events-endpoint", "tcp://*:5557", "--served-model-name", "demo"},
	},
}

type goldenCommand struct {
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
}

type goldenFile struct {
	WorkerFlags []string        `json:"worker_flags"`
	EngineArgs  []string        `json:"engine_args"`
	Env         []string        `json:"env"`
	Command     goldenCommand   `json:"command"`
	Record      json.RawMessage `json:"record"`
	Warnings    []string        `json:"warnings"`
}

// TestGoldenLaunches prepares representative real invocations and compares
// the command line, environment and advertised record with
// testdata/golden/<case>.json (go test ./engines -run Golden -update
// rewrites them).
func TestGoldenLaunches(t *testing.T) {
	seen := map[string]bool{}
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Lookup(tc.engine)
			if err != nil {
				t.Fatal(err)
			}
			opts := tc.opts
			opts.LookupEnv = func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			opts.portBlock = seqPorts(40000)
			opts.interfaces = goldenMachine
			opts.newID = func() string { return "0123abcd" }
			if tc.engine == "sim" && opts.Bin == "" {
				opts.Bin = "/usr/local/bin/infera"
			}
			l, err := a.Prepare(opts, tc.args)
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			rec := l.Endpoint.Record(a.Name())
			raw, err := rec.Encode()
			if err != nil {
				t.Fatalf("record: %v", err)
			}
			out := goldenFile{
				WorkerFlags: append([]string{"--engine", tc.engine}, tc.workerFlags...),
				EngineArgs:  tc.args,
				Env:         sortedEnv(tc.env),
				Command:     goldenCommand{Path: l.Command.Path, Args: l.Command.Args, Env: l.Command.Env},
				Record:      raw,
				Warnings:    l.Warnings,
			}
			// [] rather than null: every file reads the same way.
			if out.Warnings == nil {
				out.Warnings = []string{}
			}
			if out.Command.Env == nil {
				out.Command.Env = []string{}
			}
			got, err := marshalGolden(out)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "golden", tc.name+".json")
			seen[filepath.Base(path)] = true
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs (run with -update if the change is intended)\n--- got\n%s\n--- want\n%s", path, got, want)
			}
		})
	}
	// A golden file without a case would be a stale claim about a launch.
	entries, err := os.ReadDir(filepath.Join("testdata", "golden"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !seen[e.Name()] {
			t.Errorf("testdata/golden/%s has no case", e.Name())
		}
	}
}

func marshalGolden(v goldenFile) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func sortedEnv(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}
