package openai_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/openai"
)

func TestScanToolsAndKwargs(t *testing.T) {
	body := `{"model":"m","messages":[],"tools":[{"type":"function"}],"chat_template_kwargs":{"enable_thinking":false}}`
	var r openai.Request
	if err := openai.Scan([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if got := body[r.Tools.Start:r.Tools.End]; got != `[{"type":"function"}]` {
		t.Errorf("tools span %q", got)
	}
	if got := body[r.ChatTemplateKwargs.Start:r.ChatTemplateKwargs.End]; got != `{"enable_thinking":false}` {
		t.Errorf("kwargs span %q", got)
	}
	// Other types are left to the engine and leave the spans empty.
	if err := openai.Scan([]byte(`{"model":"m","tools":null,"chat_template_kwargs":[1]}`), &r); err != nil {
		t.Fatal(err)
	}
	if !r.Tools.Empty() || !r.ChatTemplateKwargs.Empty() {
		t.Errorf("spans %v %v, want empty", r.Tools, r.ChatTemplateKwargs)
	}
}

func TestFirstPrompt(t *testing.T) {
	tests := []struct {
		in   string
		kind openai.PromptKind
		raw  string
		esc  bool
		err  bool
	}{
		{in: `"hello"`, kind: openai.PromptText, raw: `hello`},
		{in: `"a\nb"`, kind: openai.PromptText, raw: `a\nb`, esc: true},
		{in: `[1, 2,3]`, kind: openai.PromptTokens, raw: `[1, 2,3]`},
		{in: `["first","second"]`, kind: openai.PromptText, raw: `first`},
		{in: `[[5,6],[7]]`, kind: openai.PromptTokens, raw: `[5,6]`},
		{in: `[]`, kind: openai.PromptNone},
		{in: `null`, kind: openai.PromptNone},
		{in: ``, kind: openai.PromptNone},
		{in: `3`, err: true},
		{in: `[{}]`, err: true},
	}
	for _, tc := range tests {
		p, err := openai.FirstPrompt([]byte(tc.in))
		if (err != nil) != tc.err {
			t.Errorf("%s: err %v", tc.in, err)
			continue
		}
		if p.Kind != tc.kind || string(p.Raw) != tc.raw || p.Escaped != tc.esc {
			t.Errorf("%s: got %+v (%q), want kind %d raw %q esc %v", tc.in, p, p.Raw, tc.kind, tc.raw, tc.esc)
		}
	}
}

func TestAppendTokenIDs(t *testing.T) {
	got, err := openai.AppendTokenIDs(nil, []byte(" [ 0, 1 ,4294967295 ] "))
	if err != nil || !slices.Equal(got, []uint32{0, 1, 4294967295}) {
		t.Fatalf("got %v %v", got, err)
	}
	for _, bad := range []string{`[4294967296]`, `[-1]`, `[1.5]`, `[01]`, `[1,]`, `[1] x`, `{}`, `["a"]`} {
		if _, err := openai.AppendTokenIDs(nil, []byte(bad)); !errors.Is(err, openai.ErrBadPrompt) {
			t.Errorf("%s: err %v, want ErrBadPrompt", bad, err)
		}
	}
	if got, err := openai.AppendTokenIDs(nil, []byte(`[]`)); err != nil || len(got) != 0 {
		t.Errorf("empty: %v %v", got, err)
	}
}

// TestAppendTokenIDsFastPath covers the 8-bytes-at-a-time path against
// encoding/json: every digit count 1..10 before a comma, a space, the
// closing bracket and the end of the input, and leading zeros.
func TestAppendTokenIDsFastPath(t *testing.T) {
	var cases []string
	for _, v := range []uint64{0, 7, 10, 99, 100, 12345, 99999, 100000, 149999, 1234567, 9999999, 10000000, 99999999, 123456789, 4294967295} {
		d := strconv.FormatUint(v, 10)
		for _, tail := range []string{",1]", ",22,333]", "]", " ,5]", ", 5]", ",0123456]", "]   "} {
			cases = append(cases, "["+d+tail, "[1,"+d+tail, "[ "+d+tail, "[0,"+d+tail)
		}
		cases = append(cases, "[0"+d+",1]", "["+d+",]", "["+d+",x]", "["+d+"1,2]", "["+d+"a,2]")
	}
	for _, c := range cases {
		checkTokenIDs(t, []byte(c))
	}
}

// checkTokenIDs compares AppendTokenIDs with encoding/json on one input.
func checkTokenIDs(t *testing.T, b []byte) {
	t.Helper()
	got, err := openai.AppendTokenIDs(nil, b)
	var want []uint32
	jerr := json.Unmarshal(b, &want)
	trimmed := bytes.TrimLeft(b, " \t\r\n")
	if jerr == nil && len(trimmed) > 0 && trimmed[0] == '[' {
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: got %v %v, want %v", b, got, err, want)
		}
	} else if err == nil {
		t.Errorf("%q: got %v, encoding/json refuses it (%v)", b, got, jerr)
	}
}

func FuzzAppendTokenIDs(f *testing.F) {
	f.Add([]byte(`[1,22,333,4444,55555,666666,7777777,88888888]`))
	f.Add([]byte(`[ 0 ,01,4294967296]`))
	f.Fuzz(func(t *testing.T, b []byte) { checkTokenIDs(t, b) })
}

func TestAppendUnescaped(t *testing.T) {
	if got := string(openai.AppendUnescaped(nil, []byte(`a\"b\u00e9\n`))); got != "a\"bé\n" {
		t.Fatalf("got %q", got)
	}
}

func TestVisitImages(t *testing.T) {
	msgs := `[{"role":"system","content":"s"},
	 {"role":"user","content":[{"type":"text","text":"look"},
	   {"image_url":{"detail":"low","url":"https://x/1.png"},"type":"image_url"},
	   {"type":"image_url","image_url":"https://x/2.png"},
	   {"type":"input_image","file_id":"file-9"},
	   {"type":"input_image","image_url":"data:image/png;base64,AAAA"},
	   {"type":"text","image_url":"not an image part"}]},
	 5]`
	var refs []string
	n := openai.VisitImages([]byte(msgs), func(ref []byte) { refs = append(refs, string(ref)) })
	want := []string{"https://x/1.png", "https://x/2.png", "file-9", "data:image/png;base64,AAAA"}
	if n != len(want) || !slices.Equal(refs, want) {
		t.Fatalf("got %d %q, want %q", n, refs, want)
	}
	if n := openai.VisitImages([]byte(`[{"role":"user","content":"text only"}]`), func([]byte) { t.Fatal("called") }); n != 0 {
		t.Fatalf("n = %d", n)
	}
	// The raw-type precheck keeps every image part, and skips text that
	// only talks about images.
	for msgs, want := range map[string]int{
		`[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]`:                 1,
		`[{"role":"user","content":[{"type":"image_url","image_url":"u"}]}]`:                 1,
		`[{"role":"user","content":[{"image_url":{"url":"u"},"type":"image_url"}]}]`:         1,
		`[{"role":"user","content":"an image_ur_l, input__image, image url, _image_"}]`:      0,
		`[{"role":"user","content":[{"type":"text","text":"snake_case image_"}]}, "_input"]`: 0,
	} {
		if n := openai.VisitImages([]byte(msgs), func([]byte) {}); n != want {
			t.Errorf("%s: %d images, want %d", msgs, n, want)
		}
	}
	// Malformed input never panics.
	for _, bad := range []string{``, `[`, `[{"content":[{"type":"image_url","image_url":`, `{}`, `[{"content":[{`} {
		openai.VisitImages([]byte(bad), func([]byte) {})
	}
}

func TestPromptHelpersAllocs(t *testing.T) {
	msgs := []byte(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/1.png"}}]}]`)
	var sum int
	fn := func(ref []byte) { sum += len(ref) }
	ids := make([]uint32, 0, 8)
	arr := []byte(`[1,2,3]`)
	if n := testing.AllocsPerRun(100, func() {
		openai.VisitImages(msgs, fn)
		_, _ = openai.FirstPrompt(arr)
		ids, _ = openai.AppendTokenIDs(ids[:0], arr)
	}); n != 0 {
		t.Fatalf("%.1f allocs per run, want 0", n)
	}
}

func FuzzVisitImages(f *testing.F) {
	f.Add([]byte(`[{"content":[{"type":"image_url","image_url":{"url":"u"}}]}]`))
	f.Add([]byte(`["x",{"content":[1,{"type":"input_image"}]}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		openai.VisitImages(b, func([]byte) {})
		_, _ = openai.FirstPrompt(b)
		_, _ = openai.AppendTokenIDs(nil, b)
	})
}

// BenchmarkAppendTokenIDs parses a 32k-token array of ids below 150000
// (a large vocabulary's 5- and 6-digit mix).
func BenchmarkAppendTokenIDs(b *testing.B) {
	var sb strings.Builder
	sb.WriteByte('[')
	x := uint64(1)
	for i := range 32768 {
		if i > 0 {
			sb.WriteByte(',')
		}
		x = x*6364136223846793005 + 1442695040888963407
		sb.WriteString(strconv.FormatUint(x>>33%150000, 10))
	}
	sb.WriteByte(']')
	arr := []byte(sb.String())
	ids := make([]uint32, 0, 32768)
	b.SetBytes(int64(len(arr)))
	for b.Loop() {
		ids, _ = openai.AppendTokenIDs(ids[:0], arr)
	}
}
