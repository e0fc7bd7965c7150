package router

import (
	"encoding/json"
	"testing"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/openai"
)

// Injecting the hints allocates nothing once the buffers have grown.
func TestCacheHintsAllocs(t *testing.T) {
	for _, b := range []string{
		`{"model":"m","messages":[]}`,
		`{"model":"m","kv_transfer_params":{"a":1},"prompt_cache_retention":"5m"}`,
	} {
		body := []byte(b)
		var scan openai.Request
		if err := openai.Scan(body, &scan); err != nil {
			t.Fatal(err)
		}
		var dst, tmp []byte
		for _, engine := range []string{discovery.EngineSGLang, discovery.EngineVLLM} {
			run := func() { dst, tmp, _ = appendCacheHints(dst[:0], tmp, body, &scan, engine) }
			run()
			if n := testing.AllocsPerRun(100, run); n != 0 {
				t.Fatalf("%s %s: %.1f allocations, want 0", engine, body, n)
			}
		}
	}
}

// FuzzCacheHints: for any body Scan accepts, the body a worker gets is a
// valid object with every member of the client's and the engine's hints,
// the client's own values kept.
func FuzzCacheHints(f *testing.F) {
	for _, s := range []string{
		`{"model":"m"}`, `{"model":"m" , "priority":3 }` + "\n",
		`{"model":"m","kv_transfer_params":{},"prompt_cache_retention":"24h"}`,
		`{"model":"m","kv_transfer_params":[1],"_infera_retention":"x","prompt_cache_key":"k"}`,
		`{"model":"m","kv_transfer_params":{"infera_retention":"none","b":{}},"infera_retention":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var scan openai.Request
		if openai.Scan(body, &scan) != nil {
			return
		}
		var in map[string]any
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("Scan accepted %q: %v", body, err)
		}
		for _, engine := range []string{discovery.EngineSGLang, discovery.EngineVLLM, discovery.EngineSim} {
			out, _, ok := appendCacheHints(nil, nil, body, &scan, engine)
			if !ok {
				if engine == discovery.EngineSim {
					continue
				}
				out = body
			}
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%s: %q gives invalid %q: %v", engine, body, out, err)
			}
			for k, v := range in {
				if k == "kv_transfer_params" && engine == discovery.EngineVLLM {
					continue
				}
				if gv, present := got[k]; !present || !jsonEqual(gv, v) {
					t.Fatalf("%s: %q lost or changed %s in %q", engine, body, k, out)
				}
			}
			want := []string{"priority", "infera_retention"}
			if engine == discovery.EngineVLLM {
				want = []string{"_infera_retention", "kv_transfer_params"}
				kv, _ := got["kv_transfer_params"].(map[string]any)
				if _, present := kv["infera_retention"]; !present {
					t.Fatalf("vllm: %q gives no kv_transfer_params.infera_retention in %q", body, out)
				}
			}
			for _, k := range want {
				if _, present := got[k]; !present {
					t.Fatalf("%s: %q gives no %s in %q", engine, body, k, out)
				}
			}
		}
	})
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
