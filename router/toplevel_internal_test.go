package router

import (
	"strings"
	"testing"
)

// vllmPrefillAnswer is the simulator's vLLM Nixl prefill answer to the
// callgrind script's unary request (924 bytes; docs/performance.md,
// session 25): the answer topLevelField scans for kv_transfer_params.
const vllmPrefillAnswer = `{"id":"chatcmpl-6c92572f168ad4adba45bb3045df323d","object":"chat.completion","created":1796575965,"model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":"f","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"length","stop_reason":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":796,"total_tokens":797,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}},"prompt_logprobs":null,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49],"remote_engine_id":"sim-engine","remote_host":"127.0.0.1","remote_port":46639,"remote_request_id":"nixl-69b3ef9dcc2e2d286d6ba705e0c9ec22","tp_size":1}}`

// TestTopLevelFieldBlockIDs: the prefill answer's kv_transfer_params is
// found whole, and an answer whose block ids are not JSON (the run jsonx
// reads 32 bytes at a time) has none, wherever the fault is in the run.
func TestTopLevelFieldBlockIDs(t *testing.T) {
	body := []byte(vllmPrefillAnswer)
	kv := vllmPrefillAnswer[strings.Index(vllmPrefillAnswer, `{"do_remote_prefill"`) : len(vllmPrefillAnswer)-1]
	if got := topLevelField(body, "kv_transfer_params"); string(got) != kv {
		t.Fatalf("kv_transfer_params = %s, want %s", got, kv)
	}
	for _, fault := range []struct{ from, to string }{
		{",7,", ",07,"}, {",7,", ",,"}, {",30,", ",3.,"}, {",40,", ",40e,"}, {",45,", ",4 5,"}, {",48,", ",+48,"}, {",49]", ",49,]"}, {"[0,", "[00,"}, {",12,", ",1\u00802,"},
	} {
		bad := strings.Replace(vllmPrefillAnswer, fault.from, fault.to, 1)
		if bad == vllmPrefillAnswer {
			t.Fatalf("%q is not in the answer", fault.from)
		}
		if got := topLevelField([]byte(bad), "kv_transfer_params"); got != nil {
			t.Errorf("with %q for %q: kv_transfer_params = %s, want none", fault.to, fault.from, got)
		}
	}
}

func BenchmarkTopLevelField(b *testing.B) {
	body := []byte(vllmPrefillAnswer)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if topLevelField(body, "kv_transfer_params") == nil {
			b.Fatal("no kv_transfer_params")
		}
	}
}

// TestTopLevelFieldNotObject: a body that does not open an object has no
// top-level member, though what follows its first byte reads as one (the
// callback walk skipped that byte unread).
func TestTopLevelFieldNotObject(t *testing.T) {
	for _, body := range []string{`x"kv_transfer_params":1}`, ` ["kv_transfer_params":1}`, `"kv_transfer_params":1}`, ``, `  `} {
		if got := topLevelField([]byte(body), "kv_transfer_params"); got != nil {
			t.Errorf("topLevelField(%q) = %s, want none", body, got)
		}
	}
	if got := topLevelField([]byte(" {\"a\":{\"kv_transfer_params\":0},\n\"kv_transfer_params\" : {\"b\":[1]} } "), "kv_transfer_params"); string(got) != `{"b":[1]}` {
		t.Errorf("kv_transfer_params = %s, want {\"b\":[1]}", got)
	}
}
