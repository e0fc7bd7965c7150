package router_test

import (
	"net/http"
	"testing"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// Each engine gets Infera's cache hints for the request's retention class
// (no hint: long), and a field the client set itself goes through as is.
func TestCacheHintsPerEngine(t *testing.T) {
	const base = `{"model":"m","messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, engine, body, want string
	}{
		{"sglang default", discovery.EngineSGLang, base + `}`,
			base + `,"priority":100,"infera_retention":"long"}`},
		{"sglang 5m", discovery.EngineSGLang, base + `,"prompt_cache_retention":" 5M "}`,
			base + `,"prompt_cache_retention":" 5M ","priority":50,"infera_retention":"short"}`},
		{"sglang key only", discovery.EngineSGLang, base + `,"prompt_cache_key":"s1"}` + "\n",
			base + `,"prompt_cache_key":"s1","priority":50,"infera_retention":"short"}`},
		{"sglang none, client priority", discovery.EngineSGLang, base + `,"prompt_cache_retention":"off","priority":7}`,
			base + `,"prompt_cache_retention":"off","priority":7,"infera_retention":"none"}`},
		{"sglang all client's", discovery.EngineSGLang, base + `,"priority":7,"infera_retention":"short"}`,
			base + `,"priority":7,"infera_retention":"short"}`},
		{"vllm default", discovery.EngineVLLM, base + `}`,
			base + `,"kv_transfer_params":{"infera_retention":"long"},"_infera_retention":"long"}`},
		{"vllm 24h, params object", discovery.EngineVLLM, base + `,"prompt_cache_retention":"24h","kv_transfer_params":{"do_remote_decode":true}}`,
			base + `,"prompt_cache_retention":"24h","kv_transfer_params":{"do_remote_decode":true,"infera_retention":"long"},"_infera_retention":"long"}`},
		{"vllm params null", discovery.EngineVLLM, base + `,"kv_transfer_params":null,"prompt_cache_retention":"short"}`,
			base + `,"kv_transfer_params":{"infera_retention":"short"},"prompt_cache_retention":"short","_infera_retention":"short"}`},
		{"vllm client's retention", discovery.EngineVLLM, base + `,"kv_transfer_params":{"infera_retention":"none"}}`,
			base + `,"kv_transfer_params":{"infera_retention":"none"},"_infera_retention":"long"}`},
		{"vllm all client's", discovery.EngineVLLM, base + `,"kv_transfer_params":{"infera_retention":"none"},"_infera_retention":"none"}`,
			base + `,"kv_transfer_params":{"infera_retention":"none"},"_infera_retention":"none"}`},
		{"atom untouched", discovery.EngineATOM, base + `,"prompt_cache_retention":"1h"}`,
			base + `,"prompt_cache_retention":"1h"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := jsonUpstream(t)
			rec := record(u, "m", discovery.StatusActive)
			rec.Engine = tc.engine
			tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), rec)
			if resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", tc.body); resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			seen := u.seen()
			if len(seen) != 1 {
				t.Fatalf("upstream got %d requests", len(seen))
			}
			if got := string(seen[0].Body); got != tc.want {
				t.Fatalf("worker got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}
