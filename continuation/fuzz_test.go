package continuation_test

import (
	"encoding/json"
	"testing"

	"github.com/infera/infera/continuation"
	"github.com/infera/infera/openai"
)

// FuzzObserve: any chunk an engine sends is read without panicking; a
// valid chunk stays valid JSON after its ids are stripped and after
// reshaping, and keeps no id field where the router looks for them.
func FuzzObserve(f *testing.F) {
	for _, s := range []string{
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"},"token_ids":[1]}],"prompt_token_ids":[5,6]}`,
		`{"choices":[{"index":0,"text":"x\n","logprobs":null,"finish_reason":"length","prompt_token_ids":[1],"token_ids":[2,3]}],"usage":{"prompt_tokens":1}}`,
		`{"choices":[{"index":0,"text":"b"}],"sglext":{"prompt_token_ids":[1],"completion_token_ids":[[7],[]]}}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}`,
		`{"choices":[1,{"index":1}]}`, `[]`, `{`, `{"choices":{}}`,
	} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, strip bool) {
		var tr continuation.Tracker
		tr.Reset(strip)
		out := tr.Observe(data)
		valid := json.Valid(data)
		if valid && !json.Valid(out) {
			t.Fatalf("%s stripped to invalid %s", data, out)
		}
		if valid && strip && tr.Poisoned == continuation.PoisonNone {
			// Keys exactly as written (encoding/json's struct fields would
			// also match "sgleXt", which the engines never send and the
			// tracker rightly leaves alone).
			var m map[string]json.RawMessage
			if json.Unmarshal(out, &m) == nil {
				if _, ok := m["prompt_token_ids"]; ok {
					t.Fatalf("%s kept ids: %s", data, out)
				}
				if _, ok := m["sglext"]; ok {
					t.Fatalf("%s kept ids: %s", data, out)
				}
			}
		}
		if valid {
			if r := continuation.ReshapeChat(nil, out, &tr); !json.Valid(r) {
				t.Fatalf("%s reshaped to invalid %s", out, r)
			}
		}
		_, _ = continuation.Build([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`), &tr, continuation.Options{Chat: true})
		tr.ObserveEvent(append(append([]byte("data: "), data...), "\n\n"...))
		// Found by the tracker, an event is the one the relay would
		// delimit, and its copy no longer than it.
		buf := append(append([]byte("data: "), data...), "\n\ndata: x"...)
		want := openai.NextEvent(buf)
		if out, n := tr.AppendNext(nil, buf); n > 0 && (n != want || len(out) > n) {
			t.Fatalf("%q: AppendNext took %d bytes (copy %d), the event is %d", buf, n, len(out), want)
		}
	})
}
