package sim

import (
	"encoding/json"
	"strconv"
	"testing"
)

// FuzzParseRequest: the scanner never panics, accepts only valid JSON, and
// whatever it accepts renders without panicking.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		benchChat,
		`{"prompt":"a\u00e9\ud83d\ude00","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3]}`, `{"prompt":[[1,2]]}`, `{"prompt":["x"]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"add_generation_prompt":false}`,
		`{"messages":[{"role":"a","content":null}],"n":1,"model":null}`,
		`{"a":[{"b":-0.5e+7}],"c":"\\\"\/\b\f\n\r\t"}`,
		`{"prompt":"x","stop":["a","\u0062",""]}`, `{"prompt":"x","stop":"the"}`,
		`{"prompt":"x","n":3,"stop":["a"]}`, `{"messages":[],"n":129}`, `{"prompt":"x","n":-1}`, `{"n":2.0}`,
		`{"input":["a",[1,2]],"encoding_format":"base64","dimensions":4}`, `{"input":[[1],[2]]}`,
		`{`, `{"a":01}`, `[]`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r request
		if err := parseRequest(body, &r); err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if !r.messages.empty() {
			_, _ = renderChat(nil, body, r.messages, r.addGenPrompt)
		}
		if !r.prompt.empty() {
			_, _, _ = appendPromptTokens(nil, nil, body, r.prompt, nil)
		}
		if spans, err := embeddingInputs(body, r.input); err == nil {
			for _, in := range spans {
				_, _, _ = appendPromptTokens(nil, nil, body, in, nil)
			}
		}
		if !r.stop.empty() {
			// Every stop string cuts a generated answer without panicking,
			// and the cut text never holds the match.
			q := getSeq()
			q.out = appendGenerated(q.out[:0], 1, []uint32{'h', 'i', ' '}, 64)
			q.tokens = TokenizeBytes(q.tokens[:0], q.out)
			q.maxTokens = len(q.out)
			applyStop(q, body, r.stop)
			if q.maxTokens < 1 || q.maxTokens > 64 || len(q.tokens) != q.maxTokens || (q.visible >= 0 && q.visible > q.maxTokens) {
				t.Fatalf("stop %s: %d tokens, visible %d", body[r.stop.start:r.stop.end], q.maxTokens, q.visible)
			}
			putSeq(q)
		}
	})
}

// FuzzParseDPRank: an X-Data-Parallel-Rank value is counted only when it
// is a decimal integer in [0, maxDPRanks), as strconv reads it.
func FuzzParseDPRank(f *testing.F) {
	for _, seed := range []string{"0", "3", "63", "64", "-1", "+1", "01", " 1", "", "x", "999"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		r, ok := parseDPRank(v)
		n, err := strconv.Atoi(string(v))
		want := err == nil && n >= 0 && n < maxDPRanks && v[0] != '+' && v[0] != '-'
		if ok != want || (ok && r != n) {
			t.Fatalf("parseDPRank(%q) = %d, %v; strconv says %d, %v", v, r, ok, n, err)
		}
	})
}
