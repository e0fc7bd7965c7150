package jsonx_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/infera/infera/jsonx"
)

// fieldByObject is Field as a member callback (topLevelField's walk before
// session 26): the reference Field's one-pass walk must agree with.
func fieldByObject(b []byte, key string, maxDepth int) (start, end int, err error) {
	s := jsonx.Scanner{B: b, MaxDepth: maxDepth}
	s.SkipWS()
	if s.I >= len(b) || b[s.I] != '{' {
		return -1, -1, s.Fail("expected an object")
	}
	start, end = -1, -1
	err = s.Object(func(ks, ke int, kesc bool) error {
		vs := s.I
		if err := s.Value(); err != nil {
			return err
		}
		if start < 0 && jsonx.Equal(b[ks:ke], kesc, key) {
			start, end = vs, s.I
		}
		return nil
	})
	if err != nil {
		return -1, -1, err
	}
	return start, end, nil
}

// checkField holds Field to fieldByObject on b: the same span, or the
// same error (message, offset, depth flag); and, for a valid object whose
// keys are distinct, the value encoding/json decodes for key.
func checkField(t *testing.T, b []byte, key string, maxDepth int) {
	t.Helper()
	s := jsonx.Scanner{B: b, MaxDepth: maxDepth}
	s.SkipWS()
	gs, ge, gerr := s.Field(key)
	ws, we, werr := fieldByObject(b, key, maxDepth)
	var gse, wse *jsonx.SyntaxError
	switch {
	case (gerr == nil) != (werr == nil):
		t.Fatalf("Field(%q) on %q: err %v, want %v", key, b, gerr, werr)
	case gerr != nil:
		if !errors.As(gerr, &gse) || !errors.As(werr, &wse) || *gse != *wse {
			t.Fatalf("Field(%q) on %q: err %v, want %v", key, b, gerr, werr)
		}
		return
	case gs != ws || ge != we:
		t.Fatalf("Field(%q) on %q: span [%d,%d), want [%d,%d)", key, b, gs, ge, ws, we)
	}
	if s.Depth != 0 {
		t.Fatalf("Field(%q) on %q: depth %d after the object", key, b, s.Depth)
	}
	var m map[string]json.RawMessage
	if maxDepth != 0 || json.Unmarshal(b, &m) != nil || bytes.Count(b, []byte(`":`)) != len(m) {
		return // nested, or keys that may repeat: the reference is enough
	}
	v, ok := m[key]
	if ok != (gs >= 0) || ok && !bytes.Equal(v, b[gs:ge]) {
		t.Fatalf("Field(%q) on %q: [%d,%d), encoding/json %s (%v)", key, b, gs, ge, v, ok)
	}
}

// TestFieldAgrees: Field finds what the callback walk finds and fails
// where it fails, with its message at its offset, on valid objects, each
// kind of fault at each place, and the depth bound.
func TestFieldAgrees(t *testing.T) {
	docs := []string{
		`{}`, ` { } `, `{"a":1}`, `{"a" : 1 , "b":2}`, "{\n\t\"a\"\r:\n[1, 2] }",
		`{"kv_transfer_params":{"x":1},"b":null}`, `{"b":null,"kv_transfer_params":"s"}`,
		`{"kv_transfer_params":1,"kv_transfer_params":2}`, `{"kv_transfer_param":1,"kv_transfer_paramss":2}`,
		`{"kv_transfer_\u0070arams":[true,false,null]}`, `{"k\u0076_transfer_params":0}`, `{"a\"b":1,"kv_transfer_params":{}}`,
		`{"a":{"kv_transfer_params":1},"kv_transfer_params":2}`, `{"system_fingerprint":null,"kv_transfer_params":-0.5e+3}`,
		`{"a":"` + strings.Repeat("x", 40) + `","kv_transfer_params":"` + strings.Repeat("y", 9) + `"}`,
		`{"a":1}x`, `[1]`, `"s"`, `x"a":1}`, ``, `{`, `{"a"`, `{"a":`, `{"a":1`, `{"a":1,`, `{"a":1,}`, `{"a" 1}`,
		`{a:1}`, `{"a":nul}`, `{"a":01}`, `{"a":"\x"}`, "{\"a\":\"\x01\"}", "{\"a\":\"\xff\"}", `{"a":1 "b":2}`,
		`{"kv_transfer_params":[1,2}`, `{"kv_transfer_params":{"a":[[[[1]]]]}}`, `{"a":[{"b":{"c":{}}}]}`,
	}
	keys := []string{"kv_transfer_params", "a", "b", "", "x"}
	for _, d := range docs {
		for _, k := range keys {
			for _, depth := range []int{0, 1, 2, 3, 64} {
				checkField(t, []byte(d), k, depth)
			}
		}
	}
	// Each prefix and each one-byte fault of a prefill answer.
	answer := `{"id":"chatcmpl-6c92572f168ad4adba45bb3045df323d","created":1796575965,"choices":[{"index":0,"message":{"role":"assistant","content":"f","tool_calls":[]},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":796},"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15],"remote_port":46639,"tp_size":1}}`
	for n := range len(answer) + 1 {
		checkField(t, []byte(answer[:n]), "kv_transfer_params", 64)
	}
	for i := range len(answer) {
		for _, c := range []byte{' ', '"', ',', ':', '{', '}', '[', ']', '0', 'x', '\\', 0x01, 0x80} {
			b := []byte(answer)
			b[i] = c
			checkField(t, b, "kv_transfer_params", 64)
			checkField(t, b, "remote_port", 4)
		}
	}
}

// FuzzField: Field against the callback walk on any document and key.
func FuzzField(f *testing.F) {
	f.Add([]byte(`{"a":1,"kv_transfer_params":{"b":[1,2]}}`), "kv_transfer_params", uint8(0))
	f.Add([]byte(`{"a\u0062":"x","ab":2}`), "ab", uint8(2))
	f.Add([]byte(` {"a" : [ {"b":null} ] , "c":true} `), "c", uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, key string, depth uint8) {
		checkField(t, b, key, int(depth%8))
	})
}

// TestObjectWhiteSpace: white space at each place of a member (before and
// after the colon, before and after the comma, before the closing brace)
// is skipped, and a fault next to it is reported with the message and at
// the offset the scanner gave before the walk read the compact case with
// one compare (session 26; the want strings are its output).
func TestObjectWhiteSpace(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"{\"a\" :1}", ""},
		{"{\"a\": 1}", ""},
		{"{\"a\" : 1 , \"b\" : 2 }", ""},
		{"{\"a\":1 ,\"b\":2}", ""},
		{"{\"a\":1, \"b\":2}", ""},
		{"{\"a\":1,\n\t\"b\":2}", ""},
		{"{\"a\" x:1}", "invalid JSON at byte 5: expected ':' after object key"},
		{"{\"a\" : x}", "invalid JSON at byte 7: invalid character at start of value"},
		{"{\"a\"\n", "invalid JSON at byte 5: expected ':' after object key"},
		{"{\"a\":1, x}", "invalid JSON at byte 8: expected a string key"},
		{"{\"a\":1,  }", "invalid JSON at byte 9: expected a string key"},
		{"{\"a\":1 x}", "invalid JSON at byte 7: expected ',' or '}' in object"},
		{"{\"a\":1 ", "invalid JSON at byte 7: unexpected end of input in object"},
		{"{\"a\":1,\t", "invalid JSON at byte 8: expected a string key"},
		{"{ }", ""},
		{"{ \"a\":[ 1 , 2 ] }", ""},
		{"{\"a\":[1 ,2 ]}", ""},
		{"{\"a\":\"x\" , }", "invalid JSON at byte 11: expected a string key"},
		{"{\"a\" :", "invalid JSON at byte 6: unexpected end of input, expected a value"},
		{"{\"a\":1,\"b\"\r :null}", ""},
	} {
		got := ""
		if err := jsonx.Valid([]byte(tc.in), 0); err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("Valid(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
