package openai_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/infera/infera/openai"
)

const chatBody = `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about routers.\nMake it \"nice\" \u263a."}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":128,"temperature":0.7,"top_p":1e-1,"stop":null,"n":1}`

func TestScan(t *testing.T) {
	tests := []struct {
		name string
		body string
		want openai.Request // Model compared as string; spans as raw text below
		msgs string
		prmt string
		err  error
		fld  string // FieldError.Field when err is ErrBadField
	}{
		{name: "chat", body: chatBody,
			want: openai.Request{Model: []byte("meta-llama/Llama-3.1-8B-Instruct"), Stream: true, IncludeUsage: true, MaxTokens: 128},
			msgs: `[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about routers.\nMake it \"nice\" \u263a."}]`},
		{name: "completion", body: ` { "prompt" : [1,2,3] , "model" : "m" } `,
			want: openai.Request{Model: []byte("m"), MaxTokens: -1}, prmt: `[1,2,3]`},
		{name: "prompt string", body: `{"model":"m","prompt":"hi"}`,
			want: openai.Request{Model: []byte("m"), MaxTokens: -1}, prmt: `"hi"`},
		{name: "escaped model", body: `{"model":"a\u00e9\/b\n\ud83d\ude00\ud800x"}`,
			want: openai.Request{Model: []byte("aé/b\n😀\uFFFDx"), MaxTokens: -1}},
		{name: "escaped key", body: `{"m\u006fdel":"m","str\u0065am":true}`,
			want: openai.Request{Model: []byte("m"), Stream: true, MaxTokens: -1}},
		{name: "duplicate keys last wins", body: `{"model":"a","stream":1,"model":"b","stream":false,"max_tokens":3,"max_tokens":null}`,
			want: openai.Request{Model: []byte("b"), MaxTokens: -1}},
		{name: "max_completion_tokens wins", body: `{"model":"m","max_completion_tokens":7,"max_tokens":9}`,
			want: openai.Request{Model: []byte("m"), MaxTokens: 7}},
		{name: "nulls", body: `{"model":"m","stream":null,"stream_options":null,"max_tokens":null,"messages":null,"prompt":null}`,
			want: openai.Request{Model: []byte("m"), MaxTokens: -1}},
		{name: "stream_options other keys", body: `{"model":"m","stream_options":{"x":[{}],"include_usage":false,"y":1}}`,
			want: openai.Request{Model: []byte("m"), MaxTokens: -1}},
		{name: "case sensitive keys", body: `{"model":"m","Stream":true,"MODEL":"x"}`,
			want: openai.Request{Model: []byte("m"), MaxTokens: -1}},
		{name: "nested known names ignored", body: `{"model":"m","extra":{"model":"x","stream":"no"}}`,
			want: openai.Request{Model: []byte("m"), MaxTokens: -1}},
		{name: "max int64", body: `{"model":"m","max_tokens":9223372036854775807}`,
			want: openai.Request{Model: []byte("m"), MaxTokens: 9223372036854775807}},

		{name: "empty", body: ``, err: openai.ErrInvalidJSON},
		{name: "spaces", body: "  \n", err: openai.ErrInvalidJSON},
		{name: "truncated", body: `{"model":"m"`, err: openai.ErrInvalidJSON},
		{name: "trailing comma", body: `{"model":"m",}`, err: openai.ErrInvalidJSON},
		{name: "trailing data", body: `{"model":"m"} x`, err: openai.ErrInvalidJSON},
		{name: "two values", body: `{"model":"m"}{}`, err: openai.ErrInvalidJSON},
		{name: "single quotes", body: `{'model':'m'}`, err: openai.ErrInvalidJSON},
		{name: "bad escape", body: `{"model":"\x"}`, err: openai.ErrInvalidJSON},
		{name: "short unicode escape", body: `{"model":"\u12"}`, err: openai.ErrInvalidJSON},
		{name: "control char", body: "{\"model\":\"a\tb\"}", err: openai.ErrInvalidJSON},
		{name: "invalid utf8", body: "{\"model\":\"m\",\"x\":\"\xff\"}", err: openai.ErrInvalidJSON},
		{name: "utf8 surrogate", body: "{\"model\":\"m\",\"x\":\"\xed\xa0\x80\"}", err: openai.ErrInvalidJSON},
		{name: "leading zero", body: `{"model":"m","n":01}`, err: openai.ErrInvalidJSON},
		{name: "bare dot", body: `{"model":"m","n":1.}`, err: openai.ErrInvalidJSON},
		{name: "bad exponent", body: `{"model":"m","n":1e}`, err: openai.ErrInvalidJSON},
		{name: "plus sign", body: `{"model":"m","n":+1}`, err: openai.ErrInvalidJSON},
		{name: "bad literal", body: `{"model":"m","stream":tru}`, err: openai.ErrInvalidJSON},
		{name: "unclosed array", body: `{"model":"m","messages":[1,2}`, err: openai.ErrInvalidJSON},
		{name: "too deep", body: `{"model":"m","x":` + strings.Repeat("[", openai.MaxDepth) + strings.Repeat("]", openai.MaxDepth) + `}`, err: openai.ErrTooDeep},
		{name: "bad field after bad json", body: `{"stream":1,`, err: openai.ErrInvalidJSON},

		{name: "array", body: `[1]`, err: openai.ErrNotObject},
		{name: "string", body: `"x"`, err: openai.ErrNotObject},

		{name: "model number", body: `{"model":1}`, err: openai.ErrBadField, fld: "model"},
		{name: "stream string", body: `{"model":"m","stream":"true"}`, err: openai.ErrBadField, fld: "stream"},
		{name: "stream_options array", body: `{"model":"m","stream_options":[]}`, err: openai.ErrBadField, fld: "stream_options"},
		{name: "include_usage string", body: `{"model":"m","stream_options":{"include_usage":"yes"}}`, err: openai.ErrBadField, fld: "stream_options"},
		{name: "max_tokens float", body: `{"model":"m","max_tokens":1.5}`, err: openai.ErrBadField, fld: "max_tokens"},
		{name: "max_tokens exponent", body: `{"model":"m","max_tokens":1e3}`, err: openai.ErrBadField, fld: "max_tokens"},
		{name: "max_tokens negative", body: `{"model":"m","max_tokens":-1}`, err: openai.ErrBadField, fld: "max_tokens"},
		{name: "max_tokens overflow", body: `{"model":"m","max_tokens":9223372036854775808}`, err: openai.ErrBadField, fld: "max_tokens"},
		{name: "max_completion_tokens string", body: `{"model":"m","max_completion_tokens":"5"}`, err: openai.ErrBadField, fld: "max_completion_tokens"},
		{name: "messages object", body: `{"model":"m","messages":{}}`, err: openai.ErrBadField, fld: "messages"},
		{name: "prompt number", body: `{"model":"m","prompt":3}`, err: openai.ErrBadField, fld: "prompt"},
		{name: "field error even without model", body: `{"stream":1}`, err: openai.ErrBadField, fld: "stream"},

		{name: "no model", body: `{"messages":[]}`, err: openai.ErrMissingModel},
		{name: "null model", body: `{"model":null}`, err: openai.ErrMissingModel},
		{name: "empty model", body: `{"model":""}`, err: openai.ErrMissingModel},
		{name: "empty object", body: `{}`, err: openai.ErrMissingModel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r openai.Request
			err := openai.Scan([]byte(tc.body), &r)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("Scan error = %v, want %v", err, tc.err)
				}
				if errors.Is(tc.err, openai.ErrTooDeep) && !errors.Is(err, openai.ErrInvalidJSON) {
					t.Fatalf("too deep error %v is not ErrInvalidJSON", err)
				}
				var fe *openai.FieldError
				if tc.fld != "" && (!errors.As(err, &fe) || fe.Field != tc.fld) {
					t.Fatalf("Scan error = %v, want field %q", err, tc.fld)
				}
				return
			}
			if err != nil {
				t.Fatalf("Scan: %v", err)
			}
			if string(r.Model) != string(tc.want.Model) || r.Stream != tc.want.Stream ||
				r.IncludeUsage != tc.want.IncludeUsage || r.MaxTokens != tc.want.MaxTokens {
				t.Fatalf("got model=%q stream=%v usage=%v max=%d, want model=%q stream=%v usage=%v max=%d",
					r.Model, r.Stream, r.IncludeUsage, r.MaxTokens,
					tc.want.Model, tc.want.Stream, tc.want.IncludeUsage, tc.want.MaxTokens)
			}
			if got := tc.body[r.Messages.Start:r.Messages.End]; got != tc.msgs {
				t.Fatalf("messages span = %q, want %q", got, tc.msgs)
			}
			if got := tc.body[r.Prompt.Start:r.Prompt.End]; got != tc.prmt {
				t.Fatalf("prompt span = %q, want %q", got, tc.prmt)
			}
		})
	}
}

func TestScanReuse(t *testing.T) {
	var r openai.Request
	if err := openai.Scan([]byte(`{"model":"\u0041BC","stream":true,"max_tokens":5,"prompt":"x"}`), &r); err != nil {
		t.Fatal(err)
	}
	if err := openai.Scan([]byte(`{"model":"m"}`), &r); err != nil {
		t.Fatal(err)
	}
	if string(r.Model) != "m" || r.Stream || r.MaxTokens != -1 || !r.Prompt.Empty() {
		t.Fatalf("state leaked across Scan calls: %+v", r)
	}
}

func TestScanErrorMessages(t *testing.T) {
	var r openai.Request
	err := openai.Scan([]byte(`{"model":"m","stream":"x"}`), &r)
	if err == nil || err.Error() != "field stream must be a boolean" {
		t.Fatalf("error = %v", err)
	}
	err = openai.Scan([]byte(`{"model":"m",}`), &r)
	var se *openai.SyntaxError
	if !errors.As(err, &se) || se.Offset != 13 || !strings.Contains(err.Error(), "at byte 13") {
		t.Fatalf("error = %v, want a syntax error at byte 13", err)
	}
}

func TestScanAllocs(t *testing.T) {
	bodies := map[string][]byte{
		"chat":          []byte(chatBody),
		"escaped model": []byte(`{"model":"m\u00e9","prompt":"x","unknown_\u006bey":[1,{"a":null}]}`),
		"bad field":     []byte(`{"model":"m","stream":3}`),
		"missing model": []byte(`{"prompt":"x"}`),
		"cache hints":   []byte(`{"model":"m","prompt_cache_retention":"\u0032\u0034H","priority":1,"kv_transfer_params":{"infera_retention":"none"}}`),
	}
	for name, body := range bodies {
		var r openai.Request
		_ = openai.Scan(body, &r) // warm the scratch buffer
		if n := testing.AllocsPerRun(200, func() { _ = openai.Scan(body, &r) }); n != 0 {
			t.Errorf("%s: Scan allocates %.1f times per call, want 0", name, n)
		}
	}
}

// bigChat is a multi-turn chat request of about 32 KiB.
func bigChat() []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"Qwen/Qwen3-8B","stream":true,"max_completion_tokens":512,"messages":[`)
	for i := range 64 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"`)
		for j := range 8 {
			b.WriteString(`Turn ` + strconv.Itoa(i) + `.` + strconv.Itoa(j) + ` — the quick brown fox jumps over the lazy dog; \"quoted\" text.\n`)
		}
		b.WriteString(`"}`)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// wrkBody is scripts/bench-overhead.sh's wrk body: a user message of 128
// words "w<0..4999>" (the script draws them with awk's rand; any such words
// have the same bytes' classes and about its length), max_tokens 16.
func wrkBody(stream bool) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"sim-model","messages":[{"role":"user","content":"`)
	x := uint32(1)
	for i := range 128 {
		if i > 0 {
			b.WriteByte(' ')
		}
		x = x*1664525 + 1013904223
		b.WriteString("w" + strconv.Itoa(int(x>>8)%5000))
	}
	b.WriteString(`"}],"max_tokens":16,"stream":` + strconv.FormatBool(stream) + `}`)
	return b.Bytes()
}

// BenchmarkScanWrk scans the overhead script's unary and stream bodies, the
// bodies of serve's callgrind profiles (issue 36).
func BenchmarkScanWrk(b *testing.B) {
	for _, stream := range []bool{false, true} {
		body := wrkBody(stream)
		b.Run(map[bool]string{false: "unary", true: "stream"}[stream], func(b *testing.B) {
			var r openai.Request
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := openai.Scan(body, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkScan(b *testing.B) {
	for _, bc := range []struct {
		name string
		body []byte
	}{{"small", []byte(chatBody)}, {"32KiB", bigChat()}} {
		b.Run(bc.name, func(b *testing.B) {
			var r openai.Request
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := openai.Scan(bc.body, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
		// The baseline: what a reflection-based decode of the same fields costs.
		b.Run(bc.name+"/encoding_json", func(b *testing.B) {
			var v struct {
				Model         string          `json:"model"`
				Stream        bool            `json:"stream"`
				MaxTokens     *int64          `json:"max_tokens"`
				Messages      json.RawMessage `json:"messages"`
				StreamOptions *struct {
					IncludeUsage bool `json:"include_usage"`
				} `json:"stream_options"`
			}
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := json.Unmarshal(bc.body, &v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// maxDepth is the deepest nesting of a valid JSON document.
func maxDepth(body []byte) int {
	dec := json.NewDecoder(bytes.NewReader(body))
	depth, most := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return most
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
				most = max(most, depth)
			} else {
				depth--
			}
		}
	}
}

var uintLiteral = regexp.MustCompile(`^[0-9]+$`)

// wantMaxTokens applies the scanner's rule for max_tokens values to a
// decoded value: null/absent → -1; a non-negative integer literal → it.
func wantMaxTokens(v any, present bool) (int64, bool) {
	if !present || v == nil {
		return -1, true
	}
	n, ok := v.(json.Number)
	if !ok || !uintLiteral.MatchString(n.String()) {
		return 0, false
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	return i, err == nil
}

// fieldOK reports whether the decoded document's field has the type the
// scanner requires.
func fieldOK(m map[string]any, field string) bool {
	v, present := m[field]
	switch field {
	case "model":
		_, isStr := v.(string)
		return isStr || v == nil
	case "stream":
		_, isBool := v.(bool)
		return isBool || v == nil
	case "stream_options":
		if v == nil {
			return true
		}
		so, isObj := v.(map[string]any)
		if !isObj {
			return false
		}
		_, isBool := so["include_usage"].(bool)
		return isBool || so["include_usage"] == nil
	case "max_tokens", "max_completion_tokens":
		_, ok := wantMaxTokens(v, present)
		return ok
	case "messages":
		_, isArr := v.([]any)
		return isArr || v == nil
	case "prompt":
		_, isArr := v.([]any)
		_, isStr := v.(string)
		return isArr || isStr || v == nil
	}
	return true
}

var knownFields = []string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "messages", "prompt"}

func decodeAny(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("encoding/json rejects %q: %v", b, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("encoding/json sees trailing data in %q", b)
	}
	return v
}

func FuzzScan(f *testing.F) {
	for _, s := range []string{
		chatBody, `{"model":"m","prompt":[1,2]}`, `{"model":"\u00e9\ud83d\ude00"}`, `{"model":1}`,
		`{"stream":true}`, `[]`, `{"model":"m","max_tokens":12,"max_completion_tokens":null}`,
		`{"model":"m","stream_options":{"include_usage":true}}`, `{"a":[[[[{}]]]]}`, "{\"model\":\"\xff\"}",
		`{"model":"m","x":1.5e-7,"y":-0,"z":[true,false,null]}`, `{"m\u006fdel":"x","model":null}`,
		`{"model":"m","prompt_cache_retention":"24h","kv_transfer_params":{"a":1}}`, `{"model":"m","prompt_cache_key":"k","priority":3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r openai.Request
		err := openai.Scan(body, &r)
		valid := json.Valid(body)
		switch {
		case err == nil:
			if !valid {
				t.Fatalf("Scan accepted invalid JSON %q", body)
			}
			m, ok := decodeAny(t, body).(map[string]any)
			if !ok {
				t.Fatalf("Scan accepted a non-object %q", body)
			}
			if model, _ := m["model"].(string); model != string(r.Model) {
				t.Fatalf("model = %q, encoding/json says %q", r.Model, model)
			}
			if stream, _ := m["stream"].(bool); stream != r.Stream {
				t.Fatalf("stream = %v, encoding/json says %v", r.Stream, stream)
			}
			so, _ := m["stream_options"].(map[string]any)
			if usage, _ := so["include_usage"].(bool); usage != r.IncludeUsage {
				t.Fatalf("include_usage = %v, encoding/json says %v", r.IncludeUsage, usage)
			}
			want, _ := wantMaxTokens(m["max_tokens"], true)
			if mct, present := m["max_completion_tokens"]; present && mct != nil {
				want, _ = wantMaxTokens(mct, true)
			}
			if want != r.MaxTokens {
				t.Fatalf("max tokens = %d, want %d", r.MaxTokens, want)
			}
			for _, sp := range []struct {
				name string
				span openai.Span
			}{{"messages", r.Messages}, {"prompt", r.Prompt}} {
				v := m[sp.name]
				if v == nil {
					if !sp.span.Empty() {
						t.Fatalf("%s span %v for a null or absent field", sp.name, sp.span)
					}
					continue
				}
				if got := decodeAny(t, body[sp.span.Start:sp.span.End]); !reflect.DeepEqual(got, v) {
					t.Fatalf("%s span decodes to %v, want %v", sp.name, got, v)
				}
			}
		case errors.Is(err, openai.ErrInvalidJSON):
			if valid && utf8.Valid(body) && !(errors.Is(err, openai.ErrTooDeep) && maxDepth(body) > openai.MaxDepth) {
				t.Fatalf("Scan rejected valid JSON %q: %v", body, err)
			}
		case errors.Is(err, openai.ErrNotObject):
			if _, isObj := decodeAny(t, body).(map[string]any); isObj {
				t.Fatalf("ErrNotObject for an object %q", body)
			}
		case errors.Is(err, openai.ErrBadField):
			var fe *openai.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("ErrBadField without a FieldError: %v", err)
			}
			m, ok := decodeAny(t, body).(map[string]any)
			if !ok || fieldOK(m, fe.Field) {
				t.Fatalf("Scan says field %s is bad in %q", fe.Field, body)
			}
		case errors.Is(err, openai.ErrMissingModel):
			m, ok := decodeAny(t, body).(map[string]any)
			if model, _ := m["model"].(string); !ok || model != "" || !fieldOK(m, "model") {
				t.Fatalf("ErrMissingModel for %q", body)
			}
			for _, f := range knownFields {
				if !fieldOK(m, f) {
					t.Fatalf("ErrMissingModel hides a bad field %s in %q", f, body)
				}
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
	})
}

// Scan reads the cache hints as Infera does.
func TestScanCacheHints(t *testing.T) {
	for _, tc := range []struct {
		body              string
		want              openai.Retention
		prio, infera, old bool
		kv                string
		kvRet             bool
	}{
		{body: `{"model":"m"}`, want: openai.RetentionUnset},
		{body: `{"model":"m","prompt_cache_retention":"24h"}`, want: openai.RetentionLong},
		{body: `{"model":"m","prompt_cache_retention":" 1H"}`, want: openai.RetentionLong},
		{body: `{"model":"m","prompt_cache_retention":"\u0035m"}`, want: openai.RetentionShort},
		{body: `{"model":"m","prompt_cache_retention":"disabled","prompt_cache_key":"k"}`, want: openai.RetentionNone},
		{body: `{"model":"m","prompt_cache_retention":"week","prompt_cache_key":"k"}`, want: openai.RetentionShort},
		{body: `{"model":"m","prompt_cache_key":""}`, want: openai.RetentionUnset},
		{body: `{"model":"m","prompt_cache_retention":24}`, want: openai.RetentionUnset},
		{body: `{"model":"m","priority":null,"infera_retention":1,"_infera_retention":"x"}`, prio: true, infera: true, old: true},
		{body: `{"model":"m","kv_transfer_params":{"x":[1],"infera_retention":"short"}}`, kv: `{"x":[1],"infera_retention":"short"}`, kvRet: true},
		{body: `{"model":"m","kv_transfer_params":null}`, kv: `null`},
	} {
		var r openai.Request
		if err := openai.Scan([]byte(tc.body), &r); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		kv := tc.body[r.KVTransferParams.Start:r.KVTransferParams.End]
		if r.Retention != tc.want || r.HasPriority != tc.prio || r.HasInferaRetention != tc.infera ||
			r.HasLegacyRetention != tc.old || kv != tc.kv || r.KVTransferRetention != tc.kvRet {
			t.Errorf("%s: got %v %v %v %v %q %v", tc.body, r.Retention, r.HasPriority, r.HasInferaRetention,
				r.HasLegacyRetention, kv, r.KVTransferRetention)
		}
	}
}

// Scan reads what stream continuation needs: n and best_of (1 unless an
// integer), and whether the client asked for token ids itself.
func TestScanChoicesAndIDs(t *testing.T) {
	for _, tc := range []struct {
		body      string
		n, bestOf int64
		ids       bool
	}{
		{body: `{"model":"m"}`, n: 1, bestOf: 1},
		{body: `{"model":"m","n":2,"best_of":3,"return_token_ids":false}`, n: 2, bestOf: 3, ids: true},
		{body: `{"model":"m","n":null,"best_of":"4","\u006e":5}`, n: 5, bestOf: 1},
		{body: `{"model":"m","n":1.5,"return_token_ids":null}`, n: 1, bestOf: 1, ids: true},
	} {
		var r openai.Request
		if err := openai.Scan([]byte(tc.body), &r); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if r.N != tc.n || r.BestOf != tc.bestOf || r.HasReturnTokenIDs != tc.ids {
			t.Errorf("%s: got n %d best_of %d ids %v", tc.body, r.N, r.BestOf, r.HasReturnTokenIDs)
		}
	}
}
