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
	f.Fuzz(func(t *testing.T, b []byte) { checkTokenIDsRef(t, b) })
}

// refTokenIDs is AppendTokenIDs written plainly, one byte at a time: the
// reference for its ids, its error and the ids it appended before one.
func refTokenIDs(dst []uint32, b []byte) ([]uint32, error) {
	ws := func(i int) int {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
		return i
	}
	i := ws(0)
	if i >= len(b) || b[i] != '[' {
		return dst, openai.ErrBadPrompt
	}
	if i = ws(i + 1); i < len(b) && b[i] == ']' {
		if ws(i+1) != len(b) {
			return dst, openai.ErrBadPrompt
		}
		return dst, nil
	}
	for {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		v, err := strconv.ParseUint(string(b[start:i]), 10, 32)
		if err != nil || (i-start > 1 && b[start] == '0') {
			return dst, openai.ErrBadPrompt
		}
		dst = append(dst, uint32(v))
		if i = ws(i); i >= len(b) {
			return dst, openai.ErrBadPrompt
		}
		switch b[i] {
		case ',':
			i = ws(i + 1)
		case ']':
			if ws(i+1) != len(b) {
				return dst, openai.ErrBadPrompt
			}
			return dst, nil
		default:
			return dst, openai.ErrBadPrompt
		}
	}
}

// genTokenArray builds a long token array from choices: each byte picks an
// id's digit count, its value, the separator after it and, rarely, a
// mutation (a leading zero, a stray byte, a long id), so that the 64-byte
// chunks of AppendTokenIDs meet every case at every offset.
func genTokenArray(choices []byte) []byte {
	b := []byte{'['}
	seps := []string{",", ",", ",", ", ", " ,", ",\n  ", ",  ", ",\t"}
	x := uint64(len(choices)) + 1
	for i, c := range choices {
		if i > 0 {
			b = append(b, seps[c>>5]...)
		}
		x = x*6364136223846793005 + 1442695040888963407
		switch {
		case c&31 == 31: // a mutation
			b = append(b, "0x-]9 1a,,0199999999994294967296"[x>>40%30:][:1+x>>50%3]...)
		case c&31 == 30:
			b = append(b, '0')
			b = strconv.AppendUint(b, x>>33%1000, 10)
		default:
			d := 1 + int(c&31)%10 // digits
			v := x >> 20 % 10000000000
			for v >= 1<<32 || (d < 10 && v >= pow10(d)) {
				v /= 10
			}
			b = strconv.AppendUint(b, v, 10)
		}
	}
	return append(b, ']')
}

func pow10(d int) uint64 {
	p := uint64(1)
	for range d {
		p *= 10
	}
	return p
}

// checkTokenIDsRef compares AppendTokenIDs with refTokenIDs (ids, the ids
// before an error, and whether there is one) and with encoding/json.
func checkTokenIDsRef(t *testing.T, b []byte) {
	t.Helper()
	pre := []uint32{7}
	got, err := openai.AppendTokenIDs(pre, b)
	want, werr := refTokenIDs(pre, b)
	if (err == nil) != (werr == nil) || !slices.Equal(got, want) {
		t.Fatalf("%q:\ngot  %v %v\nwant %v %v", b, got, err, want, werr)
	}
	checkTokenIDs(t, b)
}

// TestAppendTokenIDsLong: long arrays in every separator style, with ids of
// 1..10 digits and mutations, against the plain reference and encoding/json.
func TestAppendTokenIDsLong(t *testing.T) {
	x := uint64(3)
	for n := range 3000 {
		choices := make([]byte, 1+n%200)
		for i := range choices {
			x = x*6364136223846793005 + 1442695040888963407
			choices[i] = byte(x >> 56)
			switch n % 4 {
			case 0: // compact, 5 and 6 digits
				choices[i] = byte(4 + x>>40%2)
			case 1: // ", ", 1..8 digits
				choices[i] = 0x60 | byte(x>>40%8)
			case 2: // compact, rare mutations
				if x>>40%50 != 0 {
					choices[i] &= 0x1f
					if choices[i] >= 30 {
						choices[i] = 3
					}
				}
			}
		}
		checkTokenIDsRef(t, genTokenArray(choices))
	}
}

func FuzzAppendTokenIDsLong(f *testing.F) {
	f.Add([]byte("\x04\x05\x04\x05\x04\x05\x04\x05\x04\x05\x04\x05\x04\x05\x04\x05\x04\x05\x04\x05\x1f\x04\x05\x04"))
	f.Add([]byte("\x64\x65\x64\x65\x64\x65\x64\x65\x64\x65\x64\x65\x64\x65\x64\x65\x64\x65\x64\x65\x1e"))
	f.Fuzz(func(t *testing.T, choices []byte) {
		b := genTokenArray(choices)
		checkTokenIDsRef(t, b)
		// Cut anywhere: a truncated array is refused alike.
		if len(choices) > 0 {
			checkTokenIDsRef(t, b[:int(choices[0])*len(b)/256])
		}
	})
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

// BenchmarkAppendTokenIDsSeparators is BenchmarkAppendTokenIDs's array with
// the separators of other encoders: Python's json.dumps (", ") and pretty
// printers (",\n  ").
func BenchmarkAppendTokenIDsSeparators(b *testing.B) {
	for _, sep := range []string{", ", ",\n  "} {
		b.Run(strconv.Quote(sep), func(b *testing.B) {
			var sb strings.Builder
			sb.WriteByte('[')
			x := uint64(1)
			for i := range 32768 {
				if i > 0 {
					sb.WriteString(sep)
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
		})
	}
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
