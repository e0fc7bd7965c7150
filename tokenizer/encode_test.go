package tokenizer

import (
	"slices"
	"sync"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// TestConcurrentEncode encodes the goldens from many goroutines at once with
// a tiny word cache (constant eviction) and checks every result.
func TestConcurrentEncode(t *testing.T) {
	tk := withCache(loadModel(t, "llama3"), 64)
	cases := readGolden(t, goldenPath(t, "llama3", "golden-text.jsonl"))
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for w := range 8 {
		wg.Go(func() {
			var dst []uint32
			for i := range cases {
				c := cases[(i*7+w*31)%len(cases)]
				dst = tk.AppendEncode(dst[:0], c.Text)
				if !slices.Equal(dst, c.IDs) {
					errs <- c.Text
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for text := range errs {
		t.Errorf("concurrent encode differs on %q", clip(text))
	}
}

// withCache returns a copy of tk with its own word cache of n entries
// (loading a second copy takes seconds under the race detector).
func withCache(tk *HF, n int) *HF {
	m := tk.model
	m.cache = newWordCache(n, maxCachedWord)
	c := &HF{name: tk.name, model: m, normalize: tk.normalize, steps: tk.steps, leaf: tk.leaf, rawAdded: tk.rawAdded,
		normAdded: tk.normAdded, idBytes: tk.idBytes, chat: tk.chat, vocabSize: tk.vocabSize}
	c.pool.New = func() any { return new(encodeState) }
	return c
}

// TestAppendEncodeAllocs: once warm, encoding allocates nothing but the
// caller's slice.
func TestAppendEncodeAllocs(t *testing.T) {
	text := "Hello, world! KV-aware routing: 路由器 42 tokens 😀\n\n  def f(x):\n\treturn x"
	for _, m := range parityModels {
		tk := loadModel(t, m)
		dst := tk.AppendEncode(nil, text)
		if n := testing.AllocsPerRun(50, func() { dst = tk.AppendEncode(dst[:0], text) }); n != 0 {
			t.Errorf("%s: %v allocs per AppendEncode", m, n)
		}
	}
	dst := Bytes{}.AppendEncode(nil, text)
	if n := testing.AllocsPerRun(50, func() { dst = Bytes{}.AppendEncode(dst[:0], text) }); n != 0 {
		t.Errorf("bytes: %v allocs", n)
	}
}

// FuzzEncode: no input panics, and byte-level BPE is lossless: decoding the
// ids of valid UTF-8 gives back the (normalized) text.
func FuzzEncode(f *testing.F) {
	for _, c := range readGolden(f, goldenPath(f, "qwen3", "golden-text.jsonl"))[:40] {
		f.Add(c.Text)
	}
	f.Add("\xff\xfe<|im_start|>\x00")
	qwen := loadModel(f, "qwen3")
	llama := loadModel(f, "llama3")
	f.Fuzz(func(t *testing.T, s string) {
		for _, tc := range []struct {
			tk   *HF
			want string
		}{{qwen, norm.NFC.String(s)}, {llama, s}} {
			ids := tc.tk.Encode(s)
			got, err := tc.tk.Decode(ids)
			if err != nil {
				t.Fatalf("%s: decode: %v", tc.tk.Name(), err)
			}
			if utf8.ValidString(s) && got != tc.want {
				t.Fatalf("%s: decode(encode(%q)) = %q", tc.tk.Name(), s, got)
			}
		}
		b := Bytes{}
		if got, _ := b.Decode(b.Encode(s)); got != s {
			t.Fatalf("bytes round trip of %q = %q", s, got)
		}
	})
}

// TestAppendByteIDs: one id a byte, its value, after what dst held, for
// every length around the eight-byte steps and the vector rounds of 32
// (widen_amd64.s), from a string and from bytes, every byte value among
// them (a sign-extending widen would turn 0x80 and up into ids above 255),
// nothing written past the ids.
func TestAppendByteIDs(t *testing.T) {
	var text [300]byte
	for i := range text {
		text[i] = byte(250 - 9*i)
	}
	for i := range 256 {
		text[30+i] = byte(i)
	}
	for n := range len(text) + 1 {
		want := []uint32{7}
		for _, c := range text[:n] {
			want = append(want, uint32(c))
		}
		for _, from := range []string{"string", "bytes"} {
			dst := make([]uint32, 1, n+9)
			dst[0] = 7
			spare := dst[1 : n+9 : n+9]
			for i := range spare {
				spare[i] = 0xdead
			}
			var got []uint32
			if from == "string" {
				got = AppendByteIDs(dst, string(text[:n]))
			} else {
				got = AppendByteIDs(dst, text[:n])
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s of %d: %v, want %v", from, n, got, want)
			}
			if &got[0] != &dst[0] {
				t.Fatalf("%s of %d: grew a slice with room", from, n)
			}
			for i, v := range spare[n:] {
				if v != 0xdead {
					t.Fatalf("%s of %d: id %d past the end written (%#x)", from, n, n+i, v)
				}
			}
		}
	}
}

// TestWidenBytes holds the build's widenBytes (the assembly where
// haveWiden, else its Go contract) to a byte-by-byte widen over every
// byte value, at each multiple of 32 it takes.
func TestWidenBytes(t *testing.T) {
	if !haveWiden && !widenInGo {
		// The assembly needs AVX2, and AppendByteIDs does not call it
		// without: TestAppendByteIDs covered the portable loop.
		return
	}
	src := make([]byte, 512)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	for n := 32; n <= len(src); n += 32 {
		dst := make([]uint32, n+1)
		dst[n] = 0xdead
		widenBytes(&dst[0], &src[0], n)
		for i := range n {
			if dst[i] != uint32(src[i]) {
				t.Fatalf("n %d: id %d = %#x, want %#x", n, i, dst[i], src[i])
			}
		}
		if dst[n] != 0xdead {
			t.Fatalf("n %d: wrote past n", n)
		}
	}
}
