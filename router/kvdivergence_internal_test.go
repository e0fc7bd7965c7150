package router

import "testing"

func TestParseUsage(t *testing.T) {
	for _, c := range []struct {
		in             string
		prompt, cached int64
		ok             bool
	}{
		{`{"id":"x","usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}`, 120, 96, true},
		{"data: {\"choices\":[],\"usage\": {\"prompt_tokens\" : 7, \"prompt_tokens_details\": {\"cached_tokens\": 0}}}\n\n", 7, 0, true},
		// vLLM without --enable-prompt-tokens-details: no cached count.
		{`{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}`, 5, -1, true},
		{`{"choices":[{"delta":{"content":"\"usage\":{\"prompt_tokens\":3}"}}],"usage":null}`, 0, 0, false},
		{`{"choices":[]}`, 0, 0, false},
		{`{"usage":{"completion_tokens":1}}`, 0, 0, false},
		{`{"usage":{"prompt_tokens":99999999999999999999}}`, 0, 0, false},
		{`"usage"`, 0, 0, false},
	} {
		p, cached, ok := parseUsage([]byte(c.in))
		if p != c.prompt || cached != c.cached || ok != c.ok {
			t.Errorf("%s: %d %d %v, want %d %d %v", c.in, p, cached, ok, c.prompt, c.cached, c.ok)
		}
	}
}

func TestUsageTapAllocs(t *testing.T) {
	ev := []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\n")
	tok := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
	u := usageTap{want: true}
	if n := testing.AllocsPerRun(100, func() { u.note(tok); u.note(ev) }); n != 0 {
		t.Fatalf("note allocates %v", n)
	}
	if !u.seen || u.prompt != 120 || u.cached != 96 {
		t.Fatalf("tap %+v", u)
	}
}

func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":120,"prompt_tokens_details":{"cached_tokens":96}}}`))
	f.Add([]byte(`{"usage":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, c, ok := parseUsage(b)
		if ok && (p < 0 || c < -1) {
			t.Fatalf("%q: %d %d", b, p, c)
		}
	})
}
