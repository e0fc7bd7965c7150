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
// every length around the eight-byte steps, from a string and from bytes.
func TestAppendByteIDs(t *testing.T) {
	var text [27]byte
	for i := range text {
		text[i] = byte(250 - 9*i)
	}
	for n := range len(text) + 1 {
		want := []uint32{7}
		for _, c := range text[:n] {
			want = append(want, uint32(c))
		}
		if got := AppendByteIDs([]uint32{7}, string(text[:n])); !slices.Equal(got, want) {
			t.Fatalf("string of %d: %v, want %v", n, got, want)
		}
		if got := AppendByteIDs([]uint32{7}, text[:n]); !slices.Equal(got, want) {
			t.Fatalf("bytes of %d: %v, want %v", n, got, want)
		}
	}
}
