package discovery_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/infera/infera/discovery"
)

func ptr[T any](v T) *T { return &v }

func validRecord() discovery.Record {
	return discovery.Record{
		WorkerID:         "10.0.0.7:8100",
		URL:              "http://10.0.0.7:8100",
		ModelName:        "Qwen/Qwen3-8B",
		Engine:           "sim",
		DisaggMode:       discovery.DisaggMixed,
		RequestTransport: "http",
		Status:           discovery.StatusActive,
		DPSize:           1,
	}
}

// A minimal record encodes with every wire default written out, so Python
// readers need no defaults of their own, and disagg_meta as {}.
func TestRecordEncodeWritesDefaults(t *testing.T) {
	r := discovery.Record{WorkerID: "h:1", URL: "http://h:1", ModelName: "m", Engine: "vllm"}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"vllm","disagg_mode":"mixed",` +
		`"disagg_meta":{},"kv_events_endpoint":null,"kv_events_replay_endpoint":null,"kv_block_size":null,"dp_rank":null,"dp_size":1,` +
		`"request_transport":"http","status":"active"}`
	if string(b) != want {
		t.Fatalf("encoded\n got %s\nwant %s", b, want)
	}
}

// Every field survives Encode → DecodeRecord.
func TestRecordRoundTrip(t *testing.T) {
	full := discovery.Record{
		WorkerID:               "[fd00::7]:30001",
		URL:                    "https://[fd00::7]:30001",
		ModelName:              "/models/DeepSeek-R1",
		Engine:                 "sglang",
		DisaggMode:             discovery.DisaggPrefill,
		DisaggMeta:             discovery.DisaggMeta{Protocol: "sglang-bootstrap", Params: map[string]any{"bootstrap_port": float64(8998), "hosts": []any{"a", "b"}}},
		KVEventsEndpoint:       ptr("tcp://10.0.0.7:5557"),
		KVEventsReplayEndpoint: ptr("tcp://10.0.0.7:5558"),
		KVBlockSize:            ptr(64),
		DPRank:                 ptr(3),
		DPSize:                 8,
		RequestTransport:       "http",
		Status:                 discovery.StatusDraining,
		KVDPeer:                "10.0.0.7:7070",
		KVCapacityBlocks:       123456,
	}
	for _, r := range []discovery.Record{validRecord(), full} {
		b, err := r.Encode()
		if err != nil {
			t.Fatalf("encode %s: %v", r.WorkerID, err)
		}
		got, err := discovery.DecodeRecord(b)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip\n got %#v\nwant %#v", got, r)
		}
	}
	if full.Active() {
		t.Fatal("draining record reported active")
	}
}

// A record exactly as a Python Infera worker writes it (json.dumps with its
// default separators, null KV fields, no status, an extra field we do not
// know) decodes with the wire defaults applied.
func TestDecodeInferaPythonRecord(t *testing.T) {
	value := `{"worker_id": "192.168.1.20:8000", "url": "http://192.168.1.20:8000", ` +
		`"model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm", "disagg_mode": "mixed", ` +
		`"disagg_meta": {}, "kv_events_endpoint": null, "kv_block_size": null, "dp_rank": null, ` +
		`"dp_size": 1, "request_transport": "http", "registered_at": 1733000000.25}`
	got, err := discovery.DecodeRecord([]byte(value))
	if err != nil {
		t.Fatal(err)
	}
	want := discovery.Record{
		WorkerID:         "192.168.1.20:8000",
		URL:              "http://192.168.1.20:8000",
		ModelName:        "meta-llama/Llama-3.1-8B-Instruct",
		Engine:           "vllm",
		DisaggMode:       discovery.DisaggMixed,
		DPSize:           1,
		RequestTransport: "http",
		Status:           discovery.StatusActive,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n got %#v\nwant %#v", got, want)
	}
	if !got.Active() {
		t.Fatal("record without status must be active")
	}

	// Older writers may leave out dp_size and the optional fields entirely,
	// or write dp_size 0 / null and an empty endpoint string.
	for _, v := range []string{
		`{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"atom"}`,
		`{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"atom","dp_size":0,"kv_events_endpoint":"","disagg_meta":null}`,
		`{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"atom","kv_events_replay_endpoint":"","disagg_meta":{}}`,
		`{"worker_id":"h:1","url":"http://h:1/","model_name":"m","engine":"atom","dp_size":null,"disagg_meta":{"params":{}}}`,
	} {
		r, err := discovery.DecodeRecord([]byte(v))
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if r.DPSize != 1 || r.Status != discovery.StatusActive || r.DisaggMode != discovery.DisaggMixed ||
			r.RequestTransport != "http" || r.KVEventsEndpoint != nil || r.KVEventsReplayEndpoint != nil ||
			r.DisaggMeta.Params != nil {
			t.Fatalf("%s: defaults not applied: %#v", v, r)
		}
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	base := func(mod func(m map[string]any)) string {
		m := map[string]any{
			"worker_id": "h:8000", "url": "http://h:8000", "model_name": "m", "engine": "vllm",
			"disagg_mode": "mixed", "disagg_meta": map[string]any{}, "dp_size": 2, "dp_rank": 1,
			"kv_block_size": 16, "kv_events_endpoint": "tcp://h:5557", "kv_events_replay_endpoint": "tcp://h:5558",
			"request_transport": "http", "status": "active",
		}
		mod(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	set := func(k string, v any) string { return base(func(m map[string]any) { m[k] = v }) }
	del := func(k string) string { return base(func(m map[string]any) { delete(m, k) }) }
	tests := []struct {
		name, value, field string
	}{
		{"not json", `{"worker_id":`, "json"},
		{"trailing garbage", set("engine", "vllm") + "x", "json"},
		{"array", `[]`, "json"},
		{"too large", set("model_name", strings.Repeat("m", discovery.MaxRecordBytes)), "bytes"},
		{"missing worker_id", del("worker_id"), "worker_id"},
		{"worker_id without port", set("worker_id", "h"), "worker_id"},
		{"worker_id port 0", set("worker_id", "h:0"), "worker_id"},
		{"worker_id port too big", set("worker_id", "h:65536"), "worker_id"},
		{"worker_id bad host", set("worker_id", "h/x:80"), "worker_id"},
		{"worker_id bad ipv6", set("worker_id", "[zz]:80"), "worker_id"},
		{"worker_id wrong type", set("worker_id", 5), "json"},
		{"url missing", del("url"), "url"},
		{"url scheme", set("url", "ftp://h:8000"), "url"},
		{"url host differs", set("url", "http://g:8000"), "url"},
		{"url with path", set("url", "http://h:8000/v1"), "url"},
		{"url with query", set("url", "http://h:8000?x=1"), "url"},
		{"url with user", set("url", "http://u@h:8000"), "url"},
		{"model_name empty", set("model_name", ""), "model_name"},
		{"model_name control", set("model_name", "a\nb"), "model_name"},
		{"model_name too long", set("model_name", strings.Repeat("m", discovery.MaxModelNameBytes+1)), "model_name"},
		{"engine unknown", set("engine", "trt"), "engine"},
		{"disagg_mode unknown", set("disagg_mode", "both"), "disagg_mode"},
		{"disagg_meta not object", set("disagg_meta", "x"), "json"},
		{"protocol bad", set("disagg_meta", map[string]any{"protocol": "Bad Proto"}), "protocol"},
		{"kv endpoint scheme", set("kv_events_endpoint", "udp://h:1"), "kv_events_endpoint"},
		{"kv endpoint no port", set("kv_events_endpoint", "tcp://h"), "kv_events_endpoint"},
		{"replay endpoint scheme", set("kv_events_replay_endpoint", "ipc:///tmp/x"), "kv_events_replay_endpoint"},
		{"replay endpoint bad port", set("kv_events_replay_endpoint", "tcp://h:0"), "kv_events_replay_endpoint"},
		{"replay endpoint wrong type", set("kv_events_replay_endpoint", 5558), "json"},
		{"kv_block_size zero", set("kv_block_size", 0), "kv_block_size"},
		{"kv_block_size negative", set("kv_block_size", -16), "kv_block_size"},
		{"kv_block_size huge", set("kv_block_size", discovery.MaxKVBlockSize+1), "kv_block_size"},
		{"kv_block_size float", set("kv_block_size", 16.5), "json"},
		{"kv_capacity_blocks negative", set("kv_capacity_blocks", -1), "kv_capacity_blocks"},
		{"kv_capacity_blocks huge", set("kv_capacity_blocks", discovery.MaxKVCapacityBlocks+1), "kv_capacity_blocks"},
		{"kv_capacity_blocks float", set("kv_capacity_blocks", 400.5), "json"},
		{"dp_size negative", set("dp_size", -1), "dp_size"},
		{"dp_size huge", set("dp_size", discovery.MaxDPSize+1), "dp_size"},
		{"dp_rank equal size", set("dp_rank", 2), "dp_rank"},
		{"dp_rank negative", set("dp_rank", -1), "dp_rank"},
		{"dp_rank without dp_size", base(func(m map[string]any) { delete(m, "dp_size"); m["dp_rank"] = 1 }), "dp_rank"},
		{"transport bad", set("request_transport", "Bad Transport"), "request_transport"},
		{"status unknown", set("status", "gone"), "status"},
		{"kv not object", set("kv", []any{1}), "kv"},
		{"kv string", set("kv", "x"), "kv"},
		{"worker_id bad unbracketed ipv6", set("worker_id", "fe80::zz:80"), "worker_id"},
		{"worker_id ipv6 zone", set("worker_id", "fe80::1%eth0:80"), "worker_id"},
		{"real_engine bad", set("real_engine", "Sim Engine"), "real_engine"},
		{"kvd_peer without port", set("kvd_peer", "10.0.0.7"), "kvd_peer"},
		{"kvd_peer bad host", set("kvd_peer", "h/x:7070"), "kvd_peer"},
		{"kvd_peer wrong type", set("kvd_peer", 7070), "json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := discovery.DecodeRecord([]byte(tt.value))
			if !errors.Is(err, discovery.ErrInvalidRecord) {
				t.Fatalf("err = %v, want ErrInvalidRecord", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("err %q does not name %q", err, tt.field)
			}
		})
	}
	// The base itself is valid, so each case fails for its own reason.
	if _, err := discovery.DecodeRecord([]byte(set("status", "draining"))); err != nil {
		t.Fatalf("base record rejected: %v", err)
	}
}

func TestEncodeValidates(t *testing.T) {
	r := validRecord()
	r.Engine = "nope"
	if _, err := r.Encode(); !errors.Is(err, discovery.ErrInvalidRecord) {
		t.Fatalf("err = %v, want ErrInvalidRecord", err)
	}
	r = validRecord()
	r.DisaggMeta.Params = map[string]any{"ch": make(chan int)}
	if _, err := r.Encode(); !errors.Is(err, discovery.ErrInvalidRecord) {
		t.Fatalf("unencodable params: err = %v, want ErrInvalidRecord", err)
	}
}

func TestSnapshotGet(t *testing.T) {
	s := &discovery.Snapshot{Revision: 9, Workers: []discovery.Record{{WorkerID: "a:1"}, {WorkerID: "b:1"}, {WorkerID: "c:1"}}}
	for _, id := range []string{"a:1", "b:1", "c:1"} {
		if r, ok := s.Get(id); !ok || r.WorkerID != id {
			t.Fatalf("Get(%s) = %v, %v", id, r, ok)
		}
	}
	if _, ok := s.Get("bb:1"); ok {
		t.Fatal("Get of a missing id succeeded")
	}
	if _, ok := (&discovery.Snapshot{}).Get("a:1"); ok {
		t.Fatal("Get on an empty snapshot succeeded")
	}
}

// Records Infera's Python workers write that the router cannot route (yet)
// are accepted with a reason instead of being dropped; the defaults Infera's
// reader applies are ours too.
func TestDecodeInferaPythonRecordVariants(t *testing.T) {
	const head = `{"worker_id": "h:1", "url": "http://h:1", "model_name": "m"`
	tests := []struct {
		name, value string
		check       func(r discovery.Record) bool
		unroutable  string
		active      bool
	}{
		{"no engine", head + `}`, func(r discovery.Record) bool { return r.Engine == discovery.EngineSGLang }, "", true},
		{"nats transport", head + `, "engine": "vllm", "request_transport": "nats"}`,
			func(r discovery.Record) bool { return r.RequestTransport == "nats" }, "unroutable: nats transport", false},
		{"dead", head + `, "engine": "atom", "status": "dead"}`,
			func(r discovery.Record) bool { return r.Status == discovery.StatusDead }, "unroutable: status dead", false},
		{"draining", head + `, "engine": "atom", "status": "draining"}`,
			func(r discovery.Record) bool { return r.Status == discovery.StatusDraining }, "", false},
		{"kv block", head + `, "engine": "vllm", "kv": {"engine_block_size": 16, "index_block_size": 16, "tokenizer": "t", ` +
			`"tokenizer_digest": "d", "tokenizer_canary": [1, 2], "supports_events": true, "event_version": 1, ` +
			`"events_endpoint": null, "snapshot_endpoint": null, "tiers": ["device"]}}`,
			func(r discovery.Record) bool { return strings.Contains(string(r.KV), `"tokenizer_canary":[1,2]`) }, "", true},
		{"kv null", head + `, "engine": "vllm", "kv": null}`, func(r discovery.Record) bool { return r.KV == nil }, "", true},
		{"ipv6 unbracketed", `{"worker_id": "::1:28106", "url": "http://::1:28106", "model_name": "m", "engine": "vllm", ` +
			`"kv_events_endpoint": "tcp://::1:5557"}`,
			func(r discovery.Record) bool {
				return r.WorkerID == "::1:28106" && r.URL == "http://[::1]:28106" && *r.KVEventsEndpoint == "tcp://[::1]:5557"
			}, "", true},
		{"ipv6 bracketed", `{"worker_id": "[::1]:28106", "url": "http://[::1]:28106", "model_name": "m", "engine": "vllm"}`,
			func(r discovery.Record) bool { return r.WorkerID == "[::1]:28106" && r.URL == "http://[::1]:28106" }, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := discovery.DecodeRecord([]byte(tt.value))
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(r) {
				t.Fatalf("decoded %#v", r)
			}
			if got := r.Unroutable(); got != tt.unroutable {
				t.Fatalf("Unroutable() = %q, want %q", got, tt.unroutable)
			}
			if r.Active() != tt.active {
				t.Fatalf("Active() = %v, want %v", r.Active(), tt.active)
			}
			// What we decode we can write back, and it reads the same.
			b, err := r.Encode()
			if err != nil {
				t.Fatal(err)
			}
			again, err := discovery.DecodeRecord(b)
			if err != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("round trip: %v\n got %#v\nwant %#v", err, again, r)
			}
		})
	}
}
