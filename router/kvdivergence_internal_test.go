package router

import (
	"bytes"
	"testing"
)

func TestParseUsage(t *testing.T) {
	for _, c := range []struct {
		in                         string
		prompt, cached, completion int64
		ok                         bool
	}{
		{`{"id":"x","usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}`, 120, 96, 10, true},
		{"data: {\"choices\":[],\"usage\": {\"prompt_tokens\" : 7, \"prompt_tokens_details\": {\"cached_tokens\": 0}}}\n\n", 7, 0, -1, true},
		// vLLM without --enable-prompt-tokens-details: no cached count.
		{`{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}`, 5, -1, 1, true},
		// The details' key is not the count.
		{`{"usage":{"prompt_tokens":5,"completion_tokens_details":{"reasoning_tokens":3},"completion_tokens":4}}`, 5, -1, 4, true},
		{`{"choices":[{"delta":{"content":"\"usage\":{\"prompt_tokens\":3}"}}],"usage":null}`, 0, 0, 0, false},
		{`{"choices":[]}`, 0, 0, 0, false},
		{`{"usage":{"completion_tokens":1}}`, 0, 0, 0, false},
		{`{"usage":{"prompt_tokens":99999999999999999999}}`, 0, 0, 0, false},
		{`"usage"`, 0, 0, 0, false},
	} {
		p, cached, completion, ok := parseUsage([]byte(c.in))
		if p != c.prompt || cached != c.cached || completion != c.completion || ok != c.ok {
			t.Errorf("%s: %d %d %d %v, want %d %d %d %v", c.in, p, cached, completion, ok, c.prompt, c.cached, c.completion, c.ok)
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

// parseUsageRef is parseUsage as it was before its searches were anchored
// on a key's rarer byte (session 24): bytes.Index for each key. The
// differential test and fuzz hold the anchored one to its values.
func parseUsageRef(b []byte) (prompt, cached, completion int64, ok bool) {
	i := jsonKeyRef(b, []byte(`"usage"`))
	if i < 0 {
		return 0, 0, 0, false
	}
	b = b[i:]
	if len(b) == 0 || b[0] != '{' {
		return 0, 0, 0, false
	}
	prompt, ok = jsonIntRef(b, []byte(`"prompt_tokens"`))
	if !ok {
		return 0, 0, 0, false
	}
	cached, found := jsonIntRef(b, []byte(`"cached_tokens"`))
	if !found {
		cached = -1
	}
	completion, found = jsonIntRef(b, []byte(`"completion_tokens"`))
	if !found {
		completion = -1
	}
	return prompt, cached, completion, true
}

func jsonKeyRef(b, key []byte) int {
	off := 0
	for {
		i := bytes.Index(b[off:], key)
		if i < 0 {
			return -1
		}
		j := off + i + len(key)
		for j < len(b) && isJSONSpace(b[j]) {
			j++
		}
		if j < len(b) && b[j] == ':' {
			j++
			for j < len(b) && isJSONSpace(b[j]) {
				j++
			}
			return j
		}
		off = j
	}
}

func jsonIntRef(b, key []byte) (int64, bool) {
	i := jsonKeyRef(b, key)
	if i < 0 || i >= len(b) || b[i] < '0' || b[i] > '9' {
		return 0, false
	}
	var v int64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if v > (1<<62)/10 {
			return 0, false
		}
		v = v*10 + int64(b[i]-'0')
	}
	return v, true
}

// usageCorpus is the differential test's inputs and the fuzz seeds: the
// keys where the anchor byte sits near an edge, keys that overlap, a key
// not followed by a colon, the anchor bytes in other keys and strings.
var usageCorpus = []string{
	`{"usage":{"prompt_tokens":120,"prompt_tokens_details":{"cached_tokens":96}}}`,
	`{"usage":null}`,
	`{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a big egg"},"logprobs":null,"finish_reason":"length"}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":796,"total_tokens":812,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":0}},"prompt_logprobs":null,"kv_transfer_params":null}`,
	`"usage"usage":{"prompt_tokens":1}`,
	`"usage""usage":{"prompt_tokens":1}`,
	`"usage" x "usage" : {"prompt_tokens"` + "\t:\n" + `2,"cached_tokens""cached_tokens":3}`,
	`{"usage":{"prompt_tokens"`,
	`{"usage":{"prompt_tokens":`,
	`{"usage":{"prompt_tokens":5,"cached_tokens"`,
	`{"usage":{"prompt_tokens":5,"cached_tokens":`,
	`{"usage":{"prompt_tokens":5,"cached_tokens":-1}}`,
	`{"usage":{"prompt_tokens":5},"x":{"cached_tokens":7}}`,
	`{"usage":{"x":1},"prompt_tokens":9}`,
	`{"usage":{"prompt_tokens":"5"}}`,
	`{"usage":{"prompt_tokens":4611686018427387904}}`,
	`{"usage":{"prompt_tokens":461168601842738790}}`,
	`"usag"usage":{"prompt_tokens":1}`,
	`ggggg"usage"g:{"prompt_tokens":1,"hhhh":2,"cached_token":3,"cached_tokens":4}`,
	`pppp"usage":{ppp"prompt_token"prompt_tokens":8}`,
	`"usagex:{"prompt_tokens":1}`,
	`{"usage":{"prompt_tokensx:3,"prompt_tokens":4,"cached_tokensx:5}`,
	`"usage":`,
	`"usage"`,
	`g`,
	``,
}

func TestParseUsageMatchesReference(t *testing.T) {
	for _, c := range usageCorpus {
		b := []byte(c)
		// Every prefix too: a key or a value cut short at each byte.
		for n := 0; n <= len(b); n++ {
			p, cached, completion, ok := parseUsage(b[:n])
			rp, rc, rcomp, rok := parseUsageRef(b[:n])
			if p != rp || cached != rc || completion != rcomp || ok != rok {
				t.Errorf("%q: %d %d %d %v, reference %d %d %d %v", b[:n], p, cached, completion, ok, rp, rc, rcomp, rok)
			}
		}
	}
}

func FuzzParseUsage(f *testing.F) {
	for _, c := range usageCorpus {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, c, comp, ok := parseUsage(b)
		if ok && (p < 0 || c < -1 || comp < -1) {
			t.Fatalf("%q: %d %d %d", b, p, c, comp)
		}
		if rp, rc, rcomp, rok := parseUsageRef(b); p != rp || c != rc || comp != rcomp || ok != rok {
			t.Fatalf("%q: %d %d %d %v, reference %d %d %d %v", b, p, c, comp, ok, rp, rc, rcomp, rok)
		}
	})
}
