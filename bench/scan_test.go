package bench

import (
	"encoding/json"
	"testing"
)

func TestHasToken(t *testing.T) {
	cases := []struct {
		chunk string
		want  bool
	}{
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`, true},
		{`{"choices":[{"index":0,"delta":{"content": " there"}}]}`, true},
		{`{"choices":[{"index":0,"delta":{"content":null}}]}`, false},
		{`{"choices":[{"index":0,"text":"x","finish_reason":null}]}`, true},
		{`{"choices":[{"index":0,"text":"","finish_reason":"length"}]}`, false},
		{`{"choices":[{"delta":{"reasoning_content":"think"}}]}`, true},
		{`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}`, false},
		// A key-like string inside a value is escaped and does not count.
		{`{"choices":[{"delta":{"role":"assistant","content":""}}],"note":"say \"content\":\"x\""}`, false},
		{`{"role":"content","x":1}`, false},
	}
	for _, tc := range cases {
		if got := hasToken([]byte(tc.chunk)); got != tc.want {
			t.Errorf("hasToken(%s) = %v, want %v", tc.chunk, got, tc.want)
		}
	}
}

func TestScanUsage(t *testing.T) {
	cases := []struct {
		body string
		want usage
		ok   bool
	}{
		{`{"choices":[],"usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}`,
			usage{prompt: 120, completion: 10, cached: 96}, true},
		{`{"usage": { "prompt_tokens" : 7, "completion_tokens": 3 } }`, usage{prompt: 7, completion: 3}, true},
		{`{"usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":null}}`, usage{prompt: 7, completion: 3}, true},
		{`{"choices":[{"delta":{"content":"a"}}],"usage":null}`, usage{}, false},
		{`{"choices":[{"delta":{"content":"\"usage\":{\"prompt_tokens\":5}"}}]}`, usage{}, false},
		{`{"usage":{"prompt_tokens":7`, usage{}, false},
		{`{}`, usage{}, false},
	}
	for _, tc := range cases {
		got, ok := scanUsage([]byte(tc.body))
		if ok != tc.ok || got != tc.want {
			t.Errorf("scanUsage(%s) = %+v, %v; want %+v, %v", tc.body, got, ok, tc.want, tc.ok)
		}
	}
}

func TestErrorEvent(t *testing.T) {
	msg, ok := errorEvent([]byte(` {"error": {"message": "boom \"x\"", "type": "server_error"}}`))
	if !ok || msg != `boom "x"` {
		t.Fatalf("errorEvent = %q, %v", msg, ok)
	}
	if _, ok := errorEvent([]byte(`{"id":"x","choices":[{"delta":{"content":"error"}}]}`)); ok {
		t.Fatal("a normal chunk taken for an error")
	}
}

func TestScannersDoNotAllocate(t *testing.T) {
	chunk := []byte(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"word"},"finish_reason":null}],"usage":{"prompt_tokens":12,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}`)
	if n := testing.AllocsPerRun(100, func() {
		if !hasToken(chunk) {
			t.Fatal("no token")
		}
		if _, ok := scanUsage(chunk); !ok {
			t.Fatal("no usage")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per chunk, want 0", n)
	}
}

// FuzzScanUsage checks the scanner against encoding/json on any valid JSON
// object with a usage object of integers.
func FuzzScanUsage(f *testing.F) {
	f.Add(`{"usage":{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}}`)
	f.Add(`{"choices":[{"text":"\"usage\""}],"usage":null}`)
	f.Add(`{"a":"\\","usage":{"completion_tokens":5}}`)
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := scanUsage([]byte(s))
		_ = hasToken([]byte(s))
		_, _ = errorEvent([]byte(s))
		var doc struct {
			Usage *struct {
				Prompt  *int64 `json:"prompt_tokens"`
				Output  *int64 `json:"completion_tokens"`
				Details *struct {
					Cached *int64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(s), &doc) != nil || doc.Usage == nil {
			return
		}
		// Only well-behaved documents: one usage key, all keys distinct and
		// values small non-negative integers.
		var raw map[string]json.RawMessage
		if json.Unmarshal([]byte(s), &raw) != nil || len(raw) != 1 {
			return
		}
		var u map[string]json.RawMessage
		if json.Unmarshal(raw["usage"], &u) != nil {
			return
		}
		for k, v := range u {
			var n int64
			switch k {
			case "prompt_tokens", "completion_tokens":
				if json.Unmarshal(v, &n) != nil || n < 0 || n > 1<<40 || string(v) != jsonInt(n) {
					return
				}
			case "prompt_tokens_details":
				var d map[string]json.RawMessage
				if json.Unmarshal(v, &d) != nil || len(d) != 1 || json.Unmarshal(d["cached_tokens"], &n) != nil || n < 0 || n > 1<<40 || string(d["cached_tokens"]) != jsonInt(n) {
					return
				}
			default:
				return
			}
		}
		var want usage
		if doc.Usage.Prompt != nil {
			want.prompt = *doc.Usage.Prompt
		}
		if doc.Usage.Output != nil {
			want.completion = *doc.Usage.Output
		}
		if doc.Usage.Details != nil && doc.Usage.Details.Cached != nil {
			want.cached = *doc.Usage.Details.Cached
		}
		if !ok || got != want {
			t.Fatalf("scanUsage(%s) = %+v, %v; encoding/json says %+v", s, got, ok, want)
		}
	})
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
