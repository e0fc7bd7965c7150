package jsonx_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/infera/infera/jsonx"
)

func decodeStd(t *testing.T, lit []byte) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(lit, &s); err != nil {
		t.Fatalf("%q: %v", lit, err)
	}
	return s
}

func TestAppendUnescapedMatchesEncodingJSON(t *testing.T) {
	for _, lit := range []string{
		`"plain"`, `"a\"b\\c\/d\b\f\n\r\t"`, `"\u00e9\u20ac"`, `"\ud83d\ude00"`,
		`"\ud83d"`, `"\ude00x"`, `"\ud83dx\ude00"`, "\"caf\xc3\xa9\"", "\"bad\xff\xfe\"",
		"\"\xe2\x82\"", `""`,
		// Plain runs past whole 32-byte blocks and eight-byte words, ended
		// by an escape, a non-ASCII byte and the end (plainEnd).
		`"` + strings.Repeat("abcdefgh", 5) + `x\n` + strings.Repeat("y", 33) + "\xc3\xa9" + strings.Repeat("z", 9) + `"`,
	} {
		s := jsonx.Scanner{B: []byte(lit), Lenient: true}
		st, en, esc, err := s.String()
		if err != nil {
			t.Fatalf("%q: %v", lit, err)
		}
		got := string(jsonx.AppendUnescaped(nil, []byte(lit[st:en])))
		if want := decodeStd(t, []byte(lit)); got != want {
			t.Errorf("%q: got %q, want %q", lit, got, want)
		}
		if !jsonx.Equal([]byte(lit[st:en]), esc, decodeStd(t, []byte(lit))) {
			t.Errorf("%q: Equal false", lit)
		}
	}
}

func TestAppendQuoted(t *testing.T) {
	for _, s := range []string{"", "plain", "a\"b\\c\n\r\t\x01", "é€😀", "bad\xff", "\u2028\u2029"} {
		want, _ := json.Marshal(s)
		if got := jsonx.AppendQuoted(nil, s); !bytes.Equal(got, want) {
			t.Errorf("%q: got %s, want %s", s, got, want)
		}
		if got := jsonx.AppendQuoted(nil, []byte(s)); !bytes.Equal(got, want) {
			t.Errorf("%q ([]byte): got %s, want %s", s, got, want)
		}
	}
	if got := string(jsonx.AppendQuotedRaw(nil, "a\xff\"\n")); got != "\"a\xff\\\"\\n\"" {
		t.Errorf("raw: got %q", got)
	}
}

func TestScannerErrors(t *testing.T) {
	for _, tc := range []struct {
		in      string
		tooDeep bool
	}{
		{`{"a":}`, false}, {`[1,]`, false}, {`"\x"`, false}, {"\"a\x01\"", false}, {`01`, false},
		{`1.`, false}, {`1e`, false}, {`tru`, false}, {"\"\xff\"", false},
		{strings.Repeat("[", 5) + strings.Repeat("]", 5), true},
	} {
		err := jsonx.Valid([]byte(tc.in), 4)
		if !errors.Is(err, jsonx.ErrSyntax) || errors.Is(err, jsonx.ErrTooDeep) != tc.tooDeep {
			t.Errorf("%q: got %v", tc.in, err)
		}
		var se *jsonx.SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("%q: %T is not a *SyntaxError", tc.in, err)
		}
	}
	if err := jsonx.Valid([]byte(` [[[[ {"a":[1,-2.5e+3,true,false,null,"x"]} ]]]] `), 0); err != nil {
		t.Errorf("valid: %v", err)
	}
}

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "42": 42, "-7": -7, "9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63} {
		if got, ok := jsonx.ParseInt([]byte(in)); !ok || got != want {
			t.Errorf("%s: got %d %v", in, got, ok)
		}
	}
	for _, in := range []string{"9223372036854775808", "-9223372036854775809", "1.5", "1e3", "-", ""} {
		if _, ok := jsonx.ParseInt([]byte(in)); ok {
			t.Errorf("%s: ok", in)
		}
	}
}

func decodeObj(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

func TestSetDeleteField(t *testing.T) {
	body := []byte(` { "model" : "m", "stream":true, "m\u006fdel":"dup", "messages":[{"role":"user"}] } `)
	out, err := jsonx.SetField(nil, body, "model", []byte(`"other"`), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"model": "other", "stream": true, "messages": []any{map[string]any{"role": "user"}}}
	if got := decodeObj(t, out); !reflect.DeepEqual(got, want) {
		t.Errorf("set: %s", out)
	}
	out, err = jsonx.SetField(out[:0], body, "max_tokens", []byte(`5`), 0)
	if err != nil || !strings.HasSuffix(string(out), `,"max_tokens":5}`) {
		t.Errorf("add: %s %v", out, err)
	}
	out, err = jsonx.DeleteField(nil, body, "model", 0)
	if err != nil {
		t.Fatal(err)
	}
	delete(want, "model")
	if got := decodeObj(t, out); !reflect.DeepEqual(got, want) {
		t.Errorf("delete: %s", out)
	}
	if out, err = jsonx.SetField(nil, []byte(`{}`), "a", []byte(`1`), 0); err != nil || string(out) != `{"a":1}` {
		t.Errorf("empty: %s %v", out, err)
	}
	if _, err := jsonx.SetField(nil, []byte(`[1]`), "a", []byte(`1`), 0); !errors.Is(err, jsonx.ErrNotObject) {
		t.Errorf("array: %v", err)
	}
	if _, err := jsonx.DeleteField(nil, []byte(`{"a":}`), "a", 0); !errors.Is(err, jsonx.ErrSyntax) {
		t.Errorf("bad: %v", err)
	}
	if _, err := jsonx.SetField(nil, []byte(`{}`), "a", nil, 0); !errors.Is(err, jsonx.ErrEmptyValue) {
		t.Errorf("no value: %v", err)
	}
}

// sequentialFields is SetFields' reference: SetField and DeleteField one
// after the other.
func sequentialFields(body []byte, fields []jsonx.Field) ([]byte, error) {
	cur := body
	for _, f := range fields {
		var err error
		if f.Existing && !hasMember(cur, f.Key) {
			continue
		}
		if f.Value == nil {
			cur, err = jsonx.DeleteField(nil, cur, f.Key, 16)
		} else {
			cur, err = jsonx.SetField(nil, cur, f.Key, f.Value, 16)
		}
		if err != nil {
			return nil, err
		}
	}
	return cur, nil
}

// hasMember reports whether the object body has a top-level member key.
func hasMember(body []byte, key string) bool {
	s := jsonx.Scanner{B: body, MaxDepth: 16}
	s.SkipWS()
	found := false
	err := s.Object(func(ks, ke int, kesc bool) error {
		found = found || jsonx.Equal(body[ks:ke], kesc, key)
		return s.Value()
	})
	return err == nil && found
}

// setFieldsCases are edit lists of the PD legs' shapes: deletes, sets in
// place and added, escaped and repeated keys in the body.
var setFieldsCases = [][]jsonx.Field{
	{{Key: "max_tokens", Value: []byte(`1`)}, {Key: "stream", Value: []byte(`false`)}, {Key: "stream_options"}, {Key: "kv_transfer_params", Value: []byte(`{"a":[1,2]}`)}},
	{{Key: "max_tokens", Value: []byte(`1`), Existing: true}, {Key: "max_completion_tokens", Value: []byte(`1`), Existing: true}, {Key: "kv_transfer_params", Value: []byte(`{}`)}},
	{{Key: "model"}, {Key: "stream"}},
	{{Key: "new", Value: []byte(`"x"`)}, {Key: "model", Value: []byte(`null`)}, {Key: "other", Value: []byte(`[]`)}},
}

func TestSetFieldsIsSequential(t *testing.T) {
	bodies := [][]byte{
		[]byte(` { "model" : "m", "stream":true, "m\u006fdel":"dup", "stream_options" : {"include_usage":true}, "max_tokens":16 , "messages":[{"role":"user"}] } `),
		[]byte(`{}`),
		[]byte(`{"kv_transfer_params":{"x":1},"kv_transfer_params":2}`),
	}
	for _, body := range bodies {
		for _, fields := range setFieldsCases {
			want, err := sequentialFields(body, fields)
			if err != nil {
				t.Fatal(err)
			}
			got, err := jsonx.SetFields([]byte("prefix"), body, fields, 16)
			if err != nil || string(got) != "prefix"+string(want) {
				t.Errorf("SetFields(%s, %v) = %s, %v; want %s", body, fields, got, err, want)
			}
		}
		// One walk kept for every edit list after the first (the PD
		// legs' way): each the same bytes.
		var w jsonx.Walk
		for round := range 2 {
			for _, fields := range setFieldsCases {
				want, _ := sequentialFields(body, fields)
				got, err := jsonx.SetFieldsWalk([]byte("prefix"), body, fields, 16, &w)
				if err != nil || string(got) != "prefix"+string(want) {
					t.Errorf("round %d: SetFieldsWalk(%s, %v) = %s, %v; want %s", round, body, fields, got, err, want)
				}
			}
		}
	}
	// A walk held is not used for another body, nor for the same one at
	// another depth bound, nor after Reset for new bytes at its address.
	var w jsonx.Walk
	buf := []byte(`{"a":1,"b":[[2]]}`)
	set := []jsonx.Field{{Key: "a", Value: []byte(`3`)}}
	if got, err := jsonx.SetFieldsWalk(nil, buf, set, 16, &w); err != nil || string(got) != `{"a":3,"b":[[2]]}` {
		t.Fatalf("recorded: %s, %v", got, err)
	}
	if got, err := jsonx.SetFieldsWalk(nil, []byte(`{"a":1}`), set, 16, &w); err != nil || string(got) != `{"a":3}` {
		t.Errorf("another body: %s, %v", got, err)
	}
	if _, err := jsonx.SetFieldsWalk(nil, buf, set, 2, &w); !errors.Is(err, jsonx.ErrTooDeep) {
		t.Errorf("another depth: %v, want ErrTooDeep", err)
	}
	copy(buf, `{"b":1,"a":[[2]]}`)
	w.Reset()
	if got, err := jsonx.SetFieldsWalk(nil, buf, set, 16, &w); err != nil || string(got) != `{"b":1,"a":3}` {
		t.Errorf("after Reset: %s, %v", got, err)
	}
	// A body that fails is not held: the next call walks (and fails) too.
	w.Reset()
	bad := []byte(`{"a":1,"b":}`)
	for range 2 {
		if _, err := jsonx.SetFieldsWalk(nil, bad, set, 16, &w); !errors.Is(err, jsonx.ErrSyntax) {
			t.Errorf("bad body: %v", err)
		}
	}
	// More members than a walk records: walked every time, the same bytes.
	w.Reset()
	many := []byte(`{"m0":0`)
	for i := 1; i < 70; i++ {
		many = append(many, `,"m`+strconv.Itoa(i)+`":0`...)
	}
	many = append(many, '}')
	want, _ := jsonx.SetFields(nil, many, set, 16)
	for range 2 {
		if got, err := jsonx.SetFieldsWalk(nil, many, set, 16, &w); err != nil || string(got) != string(want) {
			t.Errorf("70 members: %s, %v", got, err)
		}
	}
	two := []jsonx.Field{{Key: "a", Value: []byte(`1`)}, {Key: "a"}}
	if _, err := jsonx.SetFields(nil, []byte(`{}`), two, 16); !errors.Is(err, jsonx.ErrFieldsRepeat) {
		t.Errorf("a key twice: %v", err)
	}
	if _, err := jsonx.SetFields(nil, []byte(`{}`), []jsonx.Field{{Key: "a", Value: []byte{}}}, 16); !errors.Is(err, jsonx.ErrEmptyValue) {
		t.Errorf("empty value: %v", err)
	}
	if _, err := jsonx.SetFields(nil, []byte(`{"a":}`), setFieldsCases[0], 16); !errors.Is(err, jsonx.ErrSyntax) {
		t.Errorf("bad body: %v", err)
	}
}

// FuzzSetFields: one pass gives the bytes (and the failure) of the edits
// applied one after the other.
func FuzzSetFields(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":true,"max_tokens":3,"stream_options":{}}`), 0)
	f.Add([]byte(` {"a" : 1 , "max_tokens":[1,2]} `), 1)
	f.Add([]byte(`[]`), 2)
	f.Add([]byte(`{"max_completion_tokens":null,"max_tokens":5}`), 3)
	f.Fuzz(func(t *testing.T, body []byte, which int) {
		fields := setFieldsCases[uint(which)%uint(len(setFieldsCases))]
		want, werr := sequentialFields(body, fields)
		got, err := jsonx.SetFields(nil, body, fields, 16)
		if (werr == nil) != (err == nil) || string(got) != string(want) {
			t.Fatalf("SetFields(%q) = %q, %v; one after the other %q, %v", body, got, err, want, werr)
		}
		// The walk recorded by one edit list, spliced for every list.
		var w jsonx.Walk
		_, _ = jsonx.SetFieldsWalk(nil, body, setFieldsCases[(uint(which)+1)%uint(len(setFieldsCases))], 16, &w)
		for _, fields := range setFieldsCases {
			want, werr := jsonx.SetFields(nil, body, fields, 16)
			got, err := jsonx.SetFieldsWalk(nil, body, fields, 16, &w)
			if fmt.Sprint(err) != fmt.Sprint(werr) || string(got) != string(want) {
				t.Fatalf("SetFieldsWalk(%q, %v) = %q, %v; SetFields %q, %v", body, fields, got, err, want, werr)
			}
		}
	})
}

// setFieldValidObjects are valid objects, compact and not: SetFieldValid
// must give SetField's bytes for each, with and without the member.
var setFieldValidObjects = []string{
	`{}`,
	`{ }`,
	`{"do_remote_prefill":true,"remote_block_ids":[1,2,3],"remote_engine_id":"e-1","remote_host":"127.0.0.1","remote_port":5600}`,
	`{"a":1,"infera_retention":"short"}`,
	`{"a":1,"b":{"infera_retention":2}}`,
	`{"a":"x infera_retention y"}`,
	`{"infera\u005fretention":1,"a":2}`,
	`{"a" : 1 , "b":[ 1 ]}`,
	"{\"a\":1,\n\"b\":2}",
	`{"a":"has space","b":2}`,
	`{"a":"tab\there"}`,
	`{"a":{"b":{"c":[{}]}}}`,
}

func TestSetFieldValidAsSetField(t *testing.T) {
	for _, obj := range setFieldValidObjects {
		for _, key := range []string{"infera_retention", "a", "new \"key\""} {
			for _, value := range []string{`"long"`, `{"x":1}`, ``} {
				want, werr := jsonx.SetField([]byte("pre"), []byte(obj), key, []byte(value), 16)
				got, err := jsonx.SetFieldValid([]byte("pre"), []byte(obj), key, []byte(value), 16)
				if fmt.Sprint(err) != fmt.Sprint(werr) || string(got) != string(want) {
					t.Errorf("SetFieldValid(%s, %q, %s) = %q, %v; SetField %q, %v", obj, key, value, got, err, want, werr)
				}
			}
		}
	}
}

func FuzzSetFieldValid(f *testing.F) {
	for _, obj := range setFieldValidObjects {
		f.Add([]byte(obj), "infera_retention")
	}
	f.Fuzz(func(t *testing.T, obj []byte, key string) {
		if jsonx.Valid(obj, 16) != nil {
			return // the caller's promise
		}
		want, werr := jsonx.SetField(nil, obj, key, []byte(`"v"`), 16)
		got, err := jsonx.SetFieldValid(nil, obj, key, []byte(`"v"`), 16)
		if !errors.Is(err, werr) || string(got) != string(want) {
			t.Fatalf("SetFieldValid(%q, %q) = %q, %v; SetField %q, %v", obj, key, got, err, want, werr)
		}
	})
}

var benchBody = []byte(`{"model":"llama","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hello there, how are you today? \u00e9"}],"stream":true,"max_tokens":128,"temperature":0.7}`)

func TestEditAllocs(t *testing.T) {
	dst := make([]byte, 0, 4096)
	raw := []byte(`a\"b\u00e9 plain text`)
	x := []byte(`"x"`)
	fields := []jsonx.Field{{Key: "stream"}, {Key: "model", Value: x}, {Key: "n", Value: x}}
	compactObj := []byte(setFieldValidObjects[2])
	var walk jsonx.Walk
	n := testing.AllocsPerRun(200, func() {
		var err error
		if dst, err = jsonx.SetField(dst[:0], benchBody, "model", x, 128); err != nil {
			t.Fatal(err)
		}
		if dst, err = jsonx.SetFieldValid(dst[:0], compactObj, "infera_retention", x, 128); err != nil {
			t.Fatal(err)
		}
		if dst, err = jsonx.DeleteField(dst[:0], benchBody, "stream", 128); err != nil {
			t.Fatal(err)
		}
		dst = jsonx.AppendUnescaped(dst[:0], raw)
		dst = jsonx.AppendQuoted(dst[:0], "quote \"me\" é")
		dst = jsonx.AppendQuoted(dst[:0], raw)
		if dst, err = jsonx.SetFields(dst[:0], benchBody, fields, 128); err != nil {
			t.Fatal(err)
		}
		walk.Reset()
		for range 2 { // recorded, then spliced
			if dst, err = jsonx.SetFieldsWalk(dst[:0], benchBody, fields, 128, &walk); err != nil {
				t.Fatal(err)
			}
		}
		_ = jsonx.Equal(raw, true, "model")
		if err := jsonx.Valid(benchBody, 128); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("allocs per run = %v, want 0", n)
	}
}

func BenchmarkSetField(b *testing.B) {
	dst := make([]byte, 0, 4096)
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = jsonx.SetField(dst[:0], benchBody, "max_tokens", []byte(`1`), 128)
	}
}

func BenchmarkValid(b *testing.B) {
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		_ = jsonx.Valid(benchBody, 128)
	}
}

// FuzzScanner checks the scanner against encoding/json: the same documents
// are valid, strings decode alike, and the editor's output is valid JSON
// with the field set or gone.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":[true,null]}`, `"\ud83d\ude00"`, `[1,2`, `{"a":"\u00"}`, string(benchBody)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := jsonx.Valid(b, 0)
		if std := json.Valid(b); std != (err == nil) && utf8.Valid(b) {
			t.Fatalf("%q: jsonx %v, encoding/json valid %v", b, err, std)
		}
		if err != nil {
			return
		}
		var v any
		_ = json.Unmarshal(b, &v)
		if s, ok := v.(string); ok {
			sc := jsonx.Scanner{B: bytes.TrimSpace(b)}
			st, en, _, _ := sc.String()
			if got := string(jsonx.AppendUnescaped(nil, sc.B[st:en])); got != s {
				t.Fatalf("%q: unescaped %q, want %q", b, got, s)
			}
		}
		if m, ok := v.(map[string]any); ok {
			out, err := jsonx.SetField(nil, b, "k", []byte(`[1]`), 0)
			if err != nil {
				t.Fatalf("set %q: %v", b, err)
			}
			got := decodeObj(t, out)
			if !reflect.DeepEqual(got["k"], []any{1.0}) || len(got) != len(m)+btoi(m["k"] == nil && !has(m, "k")) {
				t.Fatalf("set %q: %s", b, out)
			}
			out, err = jsonx.DeleteField(nil, b, "k", 0)
			if err != nil || has(decodeObj(t, out), "k") {
				t.Fatalf("delete %q: %s %v", b, out, err)
			}
		}
	})
}

func has(m map[string]any, k string) bool { _, ok := m[k]; return ok }

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestIntegerArrays: the array's inline integer read accepts and refuses
// what Number does.
func TestIntegerArrays(t *testing.T) {
	for _, c := range []string{`[0,1,23,456]`, `[ 7 , 8 ]`, `[1.5,2e3,-1,0E1]`, `[01]`, `[1.]`, `[1e]`, `[1`, `[1,]`, `[0x1]`, `[1 2]`, `[[1],[2,3]]`, `[12345678901234567890]`} {
		want := json.Valid([]byte(c))
		if got := jsonx.Valid([]byte(c), 8) == nil; got != want {
			t.Errorf("Valid(%s) = %v, want %v", c, got, want)
		}
	}
	// Elements after the first are read a word at a time where the word is
	// in the body: each kind of element, at each place in a run, with and
	// without room after the array.
	elems := []string{"0", "7", "01", "00", "10", "1234567", "12345678", "123456789", "1.5", "0.5", "2e3", "1E2", "1.", "-1", "0x1", "1a", "1:", "1/", " 1", "1 ", "", "9999999,", `"1"`}
	for _, a := range elems {
		for _, b := range elems {
			for _, pad := range []string{"", "          "} {
				for _, c := range []string{`[5,` + a + `]`, `[5,` + a + `,` + b + `]`, `[5,6,` + a + `,77,` + b + `,8]`, `{"k":[5,` + a + `,` + b + `]}`} {
					c += pad
					want := json.Valid([]byte(c))
					if got := jsonx.Valid([]byte(c), 8) == nil; got != want {
						t.Errorf("Valid(%q) = %v, want %v", c, got, want)
					}
				}
			}
		}
	}
}
