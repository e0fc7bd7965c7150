package engines

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/discovery"
)

// prepare runs an adapter with the golden test seams (ports from 40000,
// the 10.0.0.5 machine, a fixed random id).
func prepare(t *testing.T, engine string, opts Options, env map[string]string, args ...string) (Launch, error) {
	t.Helper()
	a, err := Lookup(engine)
	if err != nil {
		t.Fatal(err)
	}
	opts.LookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	opts.portBlock = seqPorts(40000)
	opts.interfaces = goldenMachine
	opts.newID = func() string { return "0123abcd" }
	if opts.Bin == "" && engine == "sim" {
		opts.Bin = "/usr/local/bin/infera"
	}
	return a.Prepare(opts, args)
}

func mustPrepare(t *testing.T, engine string, opts Options, env map[string]string, args ...string) Launch {
	t.Helper()
	l, err := prepare(t, engine, opts, env, args...)
	if err != nil {
		t.Fatalf("Prepare(%s %q): %v", engine, args, err)
	}
	return l
}

func TestPrepareRefuses(t *testing.T) {
	cases := []struct {
		engine string
		args   []string
		want   string // in the error
	}{
		{"vllm", nil, "no model"},
		{"vllm", []string{"--port", "8000"}, "no model"},
		{"vllm", []string{"serve", "m"}, "drop the leading"},
		{"vllm", []string{"m", "--headless"}, "--headless"},
		{"vllm", []string{"m", "--data-parallel-size", "2", "--data-parallel-rank", "2"}, "--data-parallel-rank"},
		{"vllm", []string{"m", "-dpn", "-1"}, "--data-parallel-rank"},
		{"vllm", []string{"m", "--data-parallel-size", "0"}, "--data-parallel-size"},
		{"vllm", []string{"m", "--kv-transfer-config", "{not json"}, "kv-transfer-config"},
		{"vllm", []string{"m", "--kv-transfer-config", "[1]"}, "kv-transfer-config"},
		{"vllm", []string{"m", "--kv-transfer-config", `{"kv_role":"kv_both"} x`}, "trailing"},
		{"vllm", []string{"m", "--kv-events-config", `{"endpoint":5557}`}, "want a string"},
		{"vllm", []string{"m", "--kv-events-config", `{"endpoint":"tcp://*"}`}, "tcp://host:port"},
		{"vllm", []string{"m", "--kv-events-config"}, "needs a value"},
		{"vllm", []string{"m", "--block-size", "0"}, "--block-size"},
		{"vllm", []string{"m", "--port", "70000"}, "--port"},
		{"vllm", []string{"m", "--host", "http://x"}, "--host"},
		{"vllm", []string{"m", "--served-model-name", "a\nb"}, "model name"},
		{"sglang", []string{"--port", "30000"}, "--model-path is required"},
		{"sglang", []string{"-m", "sglang.launch_server", "--model-path", "m"}, "drop the leading"},
		{"sglang", []string{"--model-path", "m", "--disaggregation-mode", "both"}, "--disaggregation-mode"},
		{"sglang", []string{"--model-path", "m", "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0"}, "--disaggregation-bootstrap-port"},
		{"sglang", []string{"--model-path", "m", "--page-size", "x"}, "--page-size"},
		{"sglang", []string{"--model-path", "m", "--dp", "100000"}, "--dp-size"},
		{"atom", []string{"--server-port", "8000"}, "--model is required"},
		{"atom", []string{"--model", "m", "--kv-transfer-config", `{"kv_role":"kv_producer","handshake_port":"x"}`}, "handshake_port"},
		{"sim", []string{"--kv-events-endpoint", "tcp://h:x"}, "kv-events-endpoint"},
	}
	for _, tc := range cases {
		_, err := prepare(t, tc.engine, Options{}, nil, tc.args...)
		if !errors.Is(err, ErrEngineArgs) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %q: err = %v, want ErrEngineArgs naming %q", tc.engine, tc.args, err, tc.want)
		}
	}
	if _, err := prepare(t, "vllm", Options{}, map[string]string{"VLLM_MOONCAKE_BOOTSTRAP_PORT": "0"}, "m",
		"--kv-transfer-config", `{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}`); !errors.Is(err, ErrEngineArgs) {
		t.Errorf("VLLM_MOONCAKE_BOOTSTRAP_PORT=0: err = %v, want ErrEngineArgs", err)
	}
}

func TestVLLMArgForms(t *testing.T) {
	// Underscores, "=" values, short aliases and a port of 0 replaced in place.
	l := mustPrepare(t, "vllm", Options{}, nil,
		"--model=/models/m", "--served_model_name", "pub", "alias", "--host=127.0.0.1", "--port", "0",
		"-tp=2", "--block_size", "16", "--", "ignored")
	want := []string{"serve", "--model=/models/m", "--served_model_name", "pub", "alias", "--host=127.0.0.1", "--port", "40000",
		"-tp=2", "--block_size", "16", "--kv-events-config",
		`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:40001","replay_endpoint":"tcp://*:40002","topic":"kv-events"}`,
		"--", "ignored"}
	if !slices.Equal(l.Command.Args, want) {
		t.Errorf("args\n got %q\nwant %q", l.Command.Args, want)
	}
	ep := l.Endpoint
	if ep.Model != "pub" || ep.Host != "127.0.0.1" || ep.AdvertiseHost != "127.0.0.1" || ep.Port != 40000 || ep.BlockSize != 16 {
		t.Errorf("endpoint %+v", ep)
	}
}

func TestVLLMUserEventsConfig(t *testing.T) {
	cases := []struct {
		name          string
		opts          Options
		config        string // --kv-events-config value; "" = dotted args below
		dotted        []string
		wantConfig    string // the value passed on; "" = unchanged
		wantExtra     []string
		wantEvents    string
		wantReplay    string
		wantWarnSubst string
	}{
		{
			name: "empty object gets everything", config: `{}`,
			wantConfig: `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:40000","replay_endpoint":"tcp://*:40001","topic":"kv-events"}`,
			wantEvents: "tcp://10.0.0.5:40000", wantReplay: "tcp://10.0.0.5:40001",
		},
		{
			name: "their keys win", config: ` { "topic": "mine", "replay_endpoint": null, "endpoint": "tcp://*:6000" }`,
			wantConfig: ` {"enable_kv_cache_events":true,"publisher":"zmq", "topic": "mine", "replay_endpoint": null, "endpoint": "tcp://*:6000" }`,
			wantEvents: "tcp://10.0.0.5:6000",
		},
		{
			name: "bound to another address", config: `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://[::]:6000","replay_endpoint":"tcp://*:6001","topic":"t"}`,
			wantEvents: "tcp://10.0.0.5:6000", wantReplay: "tcp://10.0.0.5:6001",
		},
		{name: "disabled", config: `{"enable_kv_cache_events":false}`},
		{name: "null publisher", config: `{"enable_kv_cache_events":true,"publisher":"null"}`},
		{name: "other publisher", config: `{"enable_kv_cache_events":true,"publisher":"nats"}`, wantWarnSubst: "not zmq"},
		{name: "connect form", config: `{"endpoint":"tcp://10.0.0.9:5557"}`, wantWarnSubst: "connects"},
		{
			name: "router listener", opts: Options{KVEventsRouter: "tcp://10.0.0.1:5600"}, config: `{}`,
			wantConfig: `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://10.0.0.1:5600","topic":"kv@10.0.0.5:8000"}`,
		},
		{name: "ipc", config: `{"endpoint":"ipc:///tmp/kv"}`, wantWarnSubst: "not tcp"},
		{name: "no-kv-events leaves theirs", opts: Options{NoKVEvents: true}, config: `{"enable_kv_cache_events":true,"publisher":"zmq"}`},
		{
			name: "dotted", dotted: []string{"--kv-events-config.enable_kv_cache_events", "true", "--kv-events-config.endpoint", "tcp://*:7000"},
			wantExtra:  []string{"--kv-events-config.publisher", "zmq", "--kv-events-config.replay_endpoint", "tcp://*:40000", "--kv-events-config.topic", "kv-events"},
			wantEvents: "tcp://10.0.0.5:7000", wantReplay: "tcp://10.0.0.5:40000",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"m", "--port", "8000"}
			if tc.config != "" {
				args = append(args, "--kv-events-config", tc.config)
			}
			args = append(args, tc.dotted...)
			l := mustPrepare(t, "vllm", tc.opts, nil, args...)
			want := slices.Clone(append([]string{"serve"}, args...))
			if tc.wantConfig != "" {
				want[len(want)-1] = tc.wantConfig
			}
			want = append(want, tc.wantExtra...)
			if !slices.Equal(l.Command.Args, want) {
				t.Errorf("args\n got %q\nwant %q", l.Command.Args, want)
			}
			if l.Endpoint.KVEvents != tc.wantEvents || l.Endpoint.KVEventsReplay != tc.wantReplay {
				t.Errorf("events %q replay %q, want %q %q", l.Endpoint.KVEvents, l.Endpoint.KVEventsReplay, tc.wantEvents, tc.wantReplay)
			}
			if got := strings.Join(l.Warnings, "|"); (tc.wantWarnSubst == "") != (got == "") || !strings.Contains(got, tc.wantWarnSubst) {
				t.Errorf("warnings %q, want one containing %q", l.Warnings, tc.wantWarnSubst)
			}
		})
	}
}

func TestVLLMDisagg(t *testing.T) {
	cases := []struct {
		name       string
		env        map[string]string
		config     string
		wantMode   discovery.DisaggMode
		wantProto  string
		wantParams map[string]string // param -> fmt of value
		wantWarn   string
	}{
		{name: "kv_both is mixed", config: `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`, wantMode: discovery.DisaggMixed},
		{name: "no role is mixed", config: `{"kv_connector":"LMCacheConnectorV1"}`, wantMode: discovery.DisaggMixed},
		{name: "unknown role", config: `{"kv_connector":"NixlConnector","kv_role":"kv_lender"}`, wantMode: discovery.DisaggMixed, wantWarn: "kv_lender"},
		{
			name: "unknown connector", config: `{"kv_connector":"P2pNcclConnector","kv_role":"kv_producer"}`,
			wantMode: discovery.DisaggPrefill, wantWarn: "P2pNcclConnector",
		},
		{
			name: "mooncake with bootstrap port from env", env: map[string]string{"VLLM_MOONCAKE_BOOTSTRAP_PORT": "9100"},
			config:   `{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer","engine_id":"d0","kv_ip":"10.0.0.5","kv_port":14579}`,
			wantMode: discovery.DisaggDecode, wantProto: discovery.ProtocolVLLMMooncake,
			wantParams: map[string]string{"engine_id": "d0", "bootstrap_addr": "http://10.0.0.5:9100", "bootstrap_port": "9100", "kv_ip": "10.0.0.5", "kv_port": "14579"},
		},
		{
			name: "mori write by default", config: `{"kv_connector":"MoRIIOConnector","kv_role":"kv_consumer"}`,
			wantMode: discovery.DisaggDecode, wantProto: discovery.ProtocolVLLMMoriWrite, wantParams: map[string]string{"engine_id": "infera-0123abcd"},
		},
		{
			name: "mori read from the old env", env: map[string]string{"VLLM_MORIIO_CONNECTOR_READ_MODE": "1"},
			config:   `{"kv_connector":"MoRIIOConnector","kv_role":"kv_consumer"}`,
			wantMode: discovery.DisaggDecode, wantProto: discovery.ProtocolVLLMMoriRead,
		},
		{
			name: "mori extra config beats env", env: map[string]string{"VLLM_MORIIO_CONNECTOR_READ_MODE": "1"},
			config:   `{"kv_connector":"MoRIIOConnector","kv_role":"kv_consumer","kv_connector_extra_config":{"read_mode":false}}`,
			wantMode: discovery.DisaggDecode, wantProto: discovery.ProtocolVLLMMoriWrite,
		},
		{
			name:     "multi connector",
			config:   `{"kv_connector":"MultiConnector","kv_role":"kv_producer","kv_connector_extra_config":{"connectors":[{"kv_connector":"OffloadingConnector"},{"kv_connector":"NixlConnector","kv_connector_extra_config":{"backends":["UCX"]}}]}}`,
			wantMode: discovery.DisaggPrefill, wantProto: discovery.ProtocolVLLMNixl,
			wantParams: map[string]string{"kv_connector": "NixlConnector", "kv_connector_extra_config": "map[backends:[UCX]]"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := mustPrepare(t, "vllm", Options{NoKVEvents: true}, tc.env, "m", "--port", "8000", "--kv-transfer-config", tc.config)
			ep := l.Endpoint
			if ep.DisaggMode != tc.wantMode || ep.DisaggMeta.Protocol != tc.wantProto {
				t.Fatalf("mode %q protocol %q, want %q %q", ep.DisaggMode, ep.DisaggMeta.Protocol, tc.wantMode, tc.wantProto)
			}
			for k, v := range tc.wantParams {
				if got := fmt.Sprint(ep.DisaggMeta.Params[k]); got != v {
					t.Errorf("param %s = %s, want %s", k, got, v)
				}
			}
			if tc.wantProto == "" && ep.DisaggMeta.Params != nil {
				t.Errorf("params %v without a protocol", ep.DisaggMeta.Params)
			}
			if got := strings.Join(l.Warnings, "|"); (tc.wantWarn == "") != (got == "") || !strings.Contains(got, tc.wantWarn) {
				t.Errorf("warnings %q, want one containing %q", l.Warnings, tc.wantWarn)
			}
			rec := ep.Record("vllm")
			if _, err := rec.Encode(); err != nil {
				t.Fatalf("record does not encode: %v", err)
			}
		})
	}
}

func TestVLLMInternalDPAcrossNodes(t *testing.T) {
	l := mustPrepare(t, "vllm", Options{}, nil, "m", "--data-parallel-size", "16", "--data-parallel-size-local", "8", "--port", "8000")
	if l.Endpoint.DPSize != 16 || l.Endpoint.DPRank != nil || len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "across nodes") {
		t.Fatalf("endpoint %+v warnings %q: want a rank-multiplexed dp_size 16 and a warning", l.Endpoint, l.Warnings)
	}
	// The replay block starts after the 16 publisher ports.
	if l.Endpoint.KVEvents != "tcp://10.0.0.5:40000" || l.Endpoint.KVEventsReplay != "tcp://10.0.0.5:40016" {
		t.Fatalf("events %q replay %q", l.Endpoint.KVEvents, l.Endpoint.KVEventsReplay)
	}
	// Rank 0 of 1 is not a DP rank worth advertising.
	l = mustPrepare(t, "vllm", Options{NoKVEvents: true}, nil, "m", "--data-parallel-rank", "0", "--port", "8000")
	if l.Endpoint.DPRank != nil || l.Endpoint.DPSize != 1 {
		t.Fatalf("endpoint %+v: want no dp rank for a single rank", l.Endpoint)
	}
}

func TestSGLangAndATOMDetails(t *testing.T) {
	// The user's publisher port with DP attention: ranks on it and after it.
	l := mustPrepare(t, "sglang", Options{}, nil, "--model-path", "m", "--dp", "2", "--enable-dp-attention",
		"--kv-events-config", `{"publisher":"zmq","endpoint":"tcp://*:5557"}`)
	if l.Endpoint.KVEvents != "tcp://127.0.0.1:5557" || l.Endpoint.DPSize != 2 {
		t.Fatalf("endpoint %+v", l.Endpoint)
	}
	if got := l.Command.Args[len(l.Command.Args)-1]; got != "--enable-metrics" {
		// The port comes first (absent), then --enable-metrics; the events
		// config was theirs and only gained keys.
		t.Fatalf("args %q: want --enable-metrics added last", l.Command.Args)
	}
	if !slices.Contains(l.Command.Args, `{"replay_endpoint":"tcp://*:40001","topic":"kv-events","publisher":"zmq","endpoint":"tcp://*:5557"}`) {
		t.Fatalf("args %q: want the replay socket and topic added to their config", l.Command.Args)
	}
	// --engine-bin replaces `python -m module`.
	l = mustPrepare(t, "sglang", Options{Bin: "/opt/sglang-launch", NoKVEvents: true}, map[string]string{"PYTHONUNBUFFERED": "0"},
		"--model-path", "m", "--port", "30000", "--enable-metrics")
	if l.Command.Path != "/opt/sglang-launch" || !slices.Equal(l.Command.Args, []string{"--model-path", "m", "--port", "30000", "--enable-metrics"}) || l.Command.Env != nil {
		t.Fatalf("command %+v", l.Command)
	}
	// ATOM: a kv_connector without a protocol, an operator-given events config.
	l = mustPrepare(t, "atom", Options{}, nil, "--model", "m", "--server-port", "8000", "--port", "8006",
		"--kv-transfer-config", `{"kv_role":"kv_consumer","kv_connector":"moriio"}`,
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":null}`)
	ep := l.Endpoint
	if ep.DisaggMode != discovery.DisaggDecode || ep.DisaggMeta.Protocol != "" || len(l.Warnings) != 1 ||
		ep.KVEvents != "tcp://10.0.0.5:5557" || ep.KVEventsReplay != "" {
		t.Fatalf("endpoint %+v warnings %q", ep, l.Warnings)
	}
}

func TestSimEvents(t *testing.T) {
	cases := []struct {
		name       string
		opts       Options
		env        map[string]string
		args       []string
		wantAdded  []string // after "sim --port P"
		wantEvents string
		wantReplay string
		wantWarn   bool
	}{
		{
			name: "ipv6 host", args: []string{"--host", "::1", "--port", "9000"},
			wantAdded:  []string{"--kv-events-endpoint", "tcp://[::1]:40000", "--kv-events-replay-endpoint", "tcp://[::1]:40001"},
			wantEvents: "tcp://[::1]:40000", wantReplay: "tcp://[::1]:40001",
		},
		{
			name: "from the environment", env: map[string]string{"INFERA_KV_EVENTS_ENDPOINT": "tcp://127.0.0.1:5557"},
			args: []string{"--port", "9000"}, wantAdded: []string{"--kv-events-replay-endpoint", "tcp://127.0.0.1:40000"},
			wantEvents: "tcp://127.0.0.1:5557", wantReplay: "tcp://127.0.0.1:40000",
		},
		{name: "explicitly off", args: []string{"--port", "9000", "--kv-events-endpoint", ""}},
		{name: "no-kv-events", opts: Options{NoKVEvents: true}, args: []string{"--port", "9000"}},
		{
			// Connect-only through a router's --kv-events-listen: nothing
			// advertised, the topic names the worker.
			name: "router listener", opts: Options{KVEventsRouter: "tcp://10.0.0.1:5600"}, args: []string{"--port", "9000"},
			wantAdded: []string{"--kv-events-endpoint", "tcp://10.0.0.1:5600", "--kv-events-connect", "--kv-events-topic", "kv@127.0.0.1:9000"},
		},
		{
			name: "replay off", args: []string{"--port", "9000", "--kv-events-replay-endpoint="},
			wantAdded: []string{"--kv-events-endpoint", "tcp://127.0.0.1:40000"}, wantEvents: "tcp://127.0.0.1:40000",
		},
		{
			name: "another address", args: []string{"--port", "9000", "--kv-events-endpoint", "tcp://10.9.9.9:5557", "--kv-events-replay-endpoint", "ipc:///x"},
			wantEvents: "tcp://10.9.9.9:5557", wantWarn: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := mustPrepare(t, "sim", tc.opts, tc.env, tc.args...)
			want := append(append([]string{"sim"}, tc.wantAdded...), tc.args...)
			if !slices.Equal(l.Command.Args, want) {
				t.Errorf("args\n got %q\nwant %q", l.Command.Args, want)
			}
			if l.Endpoint.KVEvents != tc.wantEvents || l.Endpoint.KVEventsReplay != tc.wantReplay {
				t.Errorf("events %q replay %q, want %q %q", l.Endpoint.KVEvents, l.Endpoint.KVEventsReplay, tc.wantEvents, tc.wantReplay)
			}
			if (len(l.Warnings) > 0) != tc.wantWarn {
				t.Errorf("warnings %q", l.Warnings)
			}
		})
	}
}

func TestJSONArgAdd(t *testing.T) {
	keys := []jsonKey{{"a", "1"}, {"b", jsonString("x/<y>")}}
	for _, tc := range []struct {
		args, want, extra []string
	}{
		{[]string{"--c", "{}"}, []string{"--c", `{"a":1,"b":"x/<y>"}`}, nil},
		{[]string{"--c={ \"z\": 0 }"}, []string{`--c={"a":1,"b":"x/<y>", "z": 0 }`}, nil},
		{[]string{"--c", `{"z":0}`, "--c", " {}"}, []string{"--c", `{"z":0}`, "--c", ` {"a":1,"b":"x/<y>"}`}, nil},
		{[]string{"--c.z", "0"}, []string{"--c.z", "0"}, []string{"--c.a", "1", "--c.b", "x/<y>"}},
		{[]string{"x"}, []string{"x"}, []string{"--c", `{"a":1,"b":"x/<y>"}`}},
	} {
		j, err := parseJSONArg(tc.args, "c")
		if err != nil {
			t.Fatal(err)
		}
		out, extra := j.add(tc.args, keys)
		if !slices.Equal(out, tc.want) || !slices.Equal(extra, tc.extra) {
			t.Errorf("add to %q = %q + %q, want %q + %q", tc.args, out, extra, tc.want, tc.extra)
		}
		if len(tc.args) > 1 && tc.args[1] == "{}" && &out[0] == &tc.args[0] {
			t.Error("add changed the caller's arguments in place")
		}
	}
	// Dotted keys nest and merge over a whole object given before them.
	j, err := parseJSONArg([]string{"--c", `{"x":{"y":1},"k":"v"}`, "--c.x.z", "true", "--c.k", "w", "--", "--c.k", "ignored"}, "c")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(j.Obj) != "map[k:w x:map[y:1 z:true]]" || !j.Dotted {
		t.Fatalf("merged %v", j.Obj)
	}
	if _, err := parseJSONArg([]string{"--c.", "1"}, "c"); !errors.Is(err, ErrEngineArgs) {
		t.Fatalf("empty dotted key: %v", err)
	}
	if _, err := parseJSONArg([]string{"--c", "null"}, "c"); !errors.Is(err, ErrEngineArgs) {
		t.Fatalf("null object: %v", err)
	}
}

func TestArgHelpers(t *testing.T) {
	if got := appendArgs([]string{"a", "--", "b"}, "--x", "1"); !slices.Equal(got, []string{"a", "--x", "1", "--", "b"}) {
		t.Errorf("appendArgs = %q", got)
	}
	for args, want := range map[string]bool{
		"--enable-metrics":       true,
		"--enable_metrics":       true,
		"-enable-metrics=true":   true,
		"--enable-metrics=false": false,
		"-- --enable-metrics":    false,
		"--enable-metrics-x":     false,
	} {
		if got := hasEngineFlag(strings.Fields(args), "enable-metrics"); got != want {
			t.Errorf("hasEngineFlag(%q) = %v", args, got)
		}
	}
	if v, ok, err := firstEngineFlag([]string{"--n", "a", "b", "--n=c"}, "n"); err != nil || !ok || v != "a" {
		t.Errorf("firstEngineFlag = %q %v %v", v, ok, err)
	}
}

func TestFreePortBlock(t *testing.T) {
	base, err := freePortBlock("127.0.0.1", 3)
	if err != nil {
		t.Fatal(err)
	}
	for p := base; p < base+3; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d of the block is not free: %v", p, err)
		}
		ln.Close()
	}
	if _, err := freePortBlock("127.0.0.1", 0); err == nil {
		t.Fatal("a block of 0 ports was accepted")
	}
}

func TestWarnLoopbackAdvertise(t *testing.T) {
	for _, tc := range []struct {
		adv       string
		endpoints []string
		warn      bool
	}{
		{"127.0.0.1", []string{"http://127.0.0.1:2379"}, false},
		{"127.0.0.1", []string{"localhost:2379", "[::1]:2379"}, false},
		{"127.0.0.1", []string{"http://127.0.0.1:2379", "http://10.0.0.1:2379"}, true},
		{"localhost", []string{"https://etcd.example:2379"}, true},
		{"::1", []string{"10.0.0.1:2379"}, true},
		{"10.0.0.5", []string{"http://10.0.0.1:2379"}, false},
	} {
		log, buf := newTestLogger(t)
		warnLoopbackAdvertise(log, tc.adv, tc.endpoints)
		got := len(buf.Find(t, "advertising a loopback address to a remote etcd; other hosts cannot reach this engine (set --advertise-host)")) == 1
		if got != tc.warn {
			t.Errorf("advertise %s to %v: warned %v, want %v", tc.adv, tc.endpoints, got, tc.warn)
		}
	}
}

// TestEngineFlagsDashesAndNegatives: the worker reads a command line as the
// simulator's facades and the engines' argparse do (engargs): a negative
// number is a value, and nothing after "--" is a flag.
func TestEngineFlagsDashesAndNegatives(t *testing.T) {
	args := []string{"--seed", "-1", "-2", "--port", "8000", "--", "--port", "9", "--headless"}
	flags, err := parseEngineFlags(args, "seed", "port")
	if err != nil || flags["seed"] != "-1" || flags["port"] != "8000" {
		t.Fatalf("flags %v %v", flags, err)
	}
	if hasEngineFlag(args, "headless") || hasEngineFlag([]string{"-1"}, "1") {
		t.Fatal("a switch after -- or a negative number taken for a flag")
	}
	out, err := replaceEngineFlag(args, "port", "8001")
	if err != nil || out[4] != "8001" || out[7] != "9" {
		t.Fatalf("replace %q %v", out, err)
	}
}
