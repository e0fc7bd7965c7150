package engines

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// pythonAccepts applies the rules by which Infera's Python server accepts a
// worker record (infera/common/discovery.py worker_info_from_json and the
// enums of infera/common/worker_pool.py), and the ones its router needs to
// send the worker requests over HTTP. It returns nil when the Python server
// would register and route the record.
func pythonAccepts(raw []byte) error {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("json.loads: %w", err)
	}
	// data["worker_id"], data["url"], data["model_name"]: KeyError if absent.
	for _, k := range []string{"worker_id", "url", "model_name"} {
		if _, ok := m[k].(string); !ok {
			return fmt.Errorf("%s missing or not a string", k)
		}
	}
	enum := func(key, def string, values ...string) error {
		v, ok := m[key]
		if !ok {
			v = def
		}
		s, _ := v.(string)
		if !slices.Contains(values, s) {
			return fmt.Errorf("%s %v: not a valid %s", key, v, key)
		}
		return nil
	}
	// EngineType(data.get("engine", "sglang")), WorkerStatus(...), DisaggMode(...).
	if err := enum("engine", "sglang", "sglang", "vllm", "atom"); err != nil {
		return err
	}
	if err := enum("status", "active", "active", "draining", "dead"); err != nil {
		return err
	}
	if err := enum("disagg_mode", "mixed", "mixed", "prefill", "decode"); err != nil {
		return err
	}
	// dict(data.get("disagg_meta") or {}).
	switch v := m["disagg_meta"].(type) {
	case nil, map[string]any:
	default:
		return fmt.Errorf("disagg_meta %v: dict() fails", v)
	}
	// dp_rank / dp_size are used as ints or None by the DP expansion.
	for _, k := range []string{"dp_rank", "dp_size", "kv_block_size"} {
		switch v := m[k].(type) {
		case nil:
		case float64:
			if v != float64(int64(v)) {
				return fmt.Errorf("%s %v: not an int", k, v)
			}
		default:
			return fmt.Errorf("%s %v: not an int or null", k, v)
		}
	}
	// KvRegistrationMetadata.from_dict when a truthy "kv" is present.
	if kv, ok := m["kv"]; ok && kv != nil {
		d, ok := kv.(map[string]any)
		if !ok {
			return fmt.Errorf("kv %v: not a dict", kv)
		}
		for _, k := range []string{"engine_block_size", "index_block_size", "tokenizer", "tokenizer_digest", "tokenizer_canary"} {
			if _, ok := d[k]; !ok {
				return fmt.Errorf("kv.%s missing", k)
			}
		}
	}
	// The router reaches "http" workers through url; any other transport
	// needs that transport (NATS) in the Python server too.
	if t, ok := m["request_transport"]; ok && t != "http" {
		return fmt.Errorf("request_transport %v: not reachable over HTTP", t)
	}
	// The status must be active for the worker to be picked at all.
	if s, ok := m["status"]; ok && s != "active" {
		return fmt.Errorf("status %v: not routed", s)
	}
	return nil
}

// The checker rejects what Python rejects, so that the test below can fail.
func TestPythonAcceptanceRules(t *testing.T) {
	const ok = `{"worker_id": "h:1", "url": "http://h:1", "model_name": "m"`
	for value, wantOK := range map[string]bool{
		ok + `}`:                                   true, // engine defaults to sglang
		ok + `, "engine": "vllm", "dp_size": 4}`:   true,
		ok + `, "engine": "sim"}`:                  false, // EngineType("sim") raises
		ok + `, "status": "starting"}`:             false,
		ok + `, "status": "draining"}`:             false, // accepted, not routed
		ok + `, "disagg_mode": "both"}`:            false,
		ok + `, "disagg_meta": "x"}`:               false,
		ok + `, "kv": {"engine_block_size": 16}}`:  false,
		ok + `, "request_transport": "nats"}`:      false,
		ok + `, "dp_size": 1.5}`:                   false,
		`{"url": "http://h:1", "model_name": "m"}`: false,
		`[]`: false,
	} {
		if err := pythonAccepts([]byte(value)); (err == nil) != wantOK {
			t.Errorf("pythonAccepts(%s) = %v, want ok=%v", value, err, wantOK)
		}
	}
}

// Every record the Go worker writes (the golden launches of every engine
// and mode, the simulator included) passes the Python server's rules.
func TestGoWorkerRecordsPassPythonRules(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var g goldenFile
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if err := pythonAccepts(g.Record); err != nil {
			t.Errorf("%s: Python Infera would not route this record: %v\n%s", f, err, g.Record)
		}
	}
}
