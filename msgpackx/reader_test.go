package msgpackx

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func enc(t testing.TB, vs ...any) []byte {
	t.Helper()
	var b bytes.Buffer
	e := msgpack.NewEncoder(&b)
	for _, v := range vs {
		if err := e.Encode(v); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func TestRaw(t *testing.T) {
	x := NewReader()
	p := enc(t, "abc", []byte{1, 2}, nil, 7)
	x.Reset(p)
	if b, ok, err := x.Raw(); err != nil || !ok || string(b) != "abc" || cap(b) != 3 {
		t.Fatalf("str: %q %v %v cap %d", b, ok, err, cap(b))
	}
	if b, ok, err := x.Raw(); err != nil || !ok || !bytes.Equal(b, []byte{1, 2}) {
		t.Fatalf("bin: %v %v %v", b, ok, err)
	}
	if b, ok, err := x.Raw(); err != nil || ok || b != nil {
		t.Fatalf("nil: %v %v %v", b, ok, err)
	}
	if _, _, err := x.Raw(); err == nil {
		t.Fatal("an int read as str or bin")
	}
	// Aliased, not copied.
	x.Reset(p)
	b, _, _ := x.Raw()
	if &b[0] != &p[1] {
		t.Fatal("Raw copied the bytes")
	}
	// A length past the end.
	x.Reset([]byte{0xa5, 'a', 'b'})
	if _, _, err := x.Raw(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated str: %v", err)
	}
	x.Reset(nil)
	if _, _, err := x.Raw(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("empty payload: %v", err)
	}
}

func TestArrayLen(t *testing.T) {
	x := NewReader()
	x.Reset(enc(t, []int{1, 2, 3}, nil, "s"))
	if n, err := x.ArrayLen(); err != nil || n != 3 {
		t.Fatalf("array: %d %v", n, err)
	}
	for range 3 {
		_ = x.Skip(0, 4)
	}
	if n, err := x.ArrayLen(); err != nil || n != -1 {
		t.Fatalf("nil: %d %v", n, err)
	}
	if _, err := x.ArrayLen(); err == nil {
		t.Fatal("a str read as an array")
	}
	// array32 claiming 2^31 elements in a few bytes
	x.Reset([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff, 1})
	if _, err := x.ArrayLen(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("huge array length: %v", err)
	}
}

func TestSkip(t *testing.T) {
	x := NewReader()
	p := enc(t, map[string]any{"a": []any{1, "x", []byte{9}, map[string]any{"b": nil}}, "c": 1.5}, "after")
	x.Reset(p)
	if err := x.Skip(0, 8); err != nil {
		t.Fatal(err)
	}
	if b, _, err := x.Raw(); err != nil || string(b) != "after" || x.Len() != 0 || x.Offset() != len(p) {
		t.Fatalf("after skip: %q %v len %d", b, err, x.Len())
	}
	deep := bytes.Repeat([]byte{0x91}, 100) // [[[[…]]]]
	deep = append(deep, 0x01)
	x.Reset(deep)
	if err := x.Skip(0, 32); !errors.Is(err, ErrTooDeep) {
		t.Fatalf("deep nesting: %v", err)
	}
	x.Reset(deep[60:])
	if err := x.Skip(0, 64); err != nil {
		t.Fatalf("nesting within the bound: %v", err)
	}
	x.Reset([]byte{0xdf, 0x7f, 0xff, 0xff, 0xff}) // map32 of 2^31 pairs
	if err := x.Skip(0, 4); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("huge map: %v", err)
	}
	x.Reset([]byte{0x92, 0x01})
	if err := x.Skip(0, 4); err == nil {
		t.Fatal("truncated array skipped")
	}
}

func TestTypePredicates(t *testing.T) {
	for _, c := range []struct {
		v                            any
		array, mapp, str, bin, isInt bool
	}{
		{[]int{1}, true, false, false, false, false},
		{make([]int, 20), true, false, false, false, false},
		{map[string]int{"a": 1}, false, true, false, false, false},
		{"s", false, false, true, false, false},
		{string(make([]byte, 300)), false, false, true, false, false},
		{[]byte{1}, false, false, false, true, false},
		{-1, false, false, false, false, true},
		{uint64(1 << 40), false, false, false, false, true},
		{int64(-1 << 40), false, false, false, false, true},
		{1.5, false, false, false, false, false},
	} {
		b := enc(t, c.v)[0]
		if IsArray(b) != c.array || IsMap(b) != c.mapp || IsStr(b) != c.str || IsBin(b) != c.bin || IsInt(b) != c.isInt {
			t.Errorf("%T %v: code %#x misclassified", c.v, c.v, b)
		}
	}
}

func TestReaderDoesNotAllocate(t *testing.T) {
	x := NewReader()
	p := enc(t, map[string]any{"k": []any{1, "x", []byte{2}}, "m": map[string]any{"n": nil}}, "tail")
	if n := testing.AllocsPerRun(100, func() {
		x.Reset(p)
		if err := x.Skip(0, 8); err != nil {
			t.Fatal(err)
		}
		if _, _, err := x.Raw(); err != nil {
			t.Fatal(err)
		}
		x.Release()
	}); n != 0 {
		t.Fatalf("allocates %v", n)
	}
}

// FuzzSkip: any input is skipped value by value without panicking, never
// reading past its end, and Raw returns slices of the input.
func FuzzSkip(f *testing.F) {
	f.Add(enc(f, map[string]any{"a": []any{1, "x"}}, nil, 1.5))
	f.Add([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff})
	f.Add(bytes.Repeat([]byte{0x91}, 40))
	f.Fuzz(func(t *testing.T, p []byte) {
		x := NewReader()
		x.Reset(p)
		for x.Len() > 0 {
			before := x.Len()
			if c, err := x.Peek(); err == nil && (IsStr(c) || IsBin(c)) {
				b, _, err := x.Raw()
				if err != nil {
					return
				}
				if len(b) > len(p) || cap(b) != len(b) {
					t.Fatalf("raw of %d bytes from %d", len(b), len(p))
				}
				continue
			}
			if err := x.Skip(0, 16); err != nil {
				return
			}
			if x.Len() >= before || x.Offset() > len(p) {
				t.Fatalf("skip did not advance: %d → %d", before, x.Len())
			}
		}
	})
}
