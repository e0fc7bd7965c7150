package continuation

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/infera/infera/jsonx"
)

// TestTemplateLines holds the layout matchSteady relies on: what a steady
// chunk reads of its template in the template's first cache line, and
// templates that each start one (layouts starts with them, and a heap
// object of layouts' size is 64-byte aligned).
func TestTemplateLines(t *testing.T) {
	var tm template
	var l layouts
	if got := unsafe.Sizeof(tm); got%64 != 0 {
		t.Errorf("template is %d bytes, want a multiple of 64", got)
	}
	if got := unsafe.Offsetof(l.tmpls); got != 0 {
		t.Errorf("layouts.tmpls at %d, want 0", got)
	}
	if end := unsafe.Offsetof(tm.tailWord) + unsafe.Sizeof(tm.tailWord); end > 64 {
		t.Errorf("the fields a steady chunk reads end at byte %d of its template, want within 64", end)
	}
	// Go's size classes from 1 KiB up are multiples of 128 bytes, so a
	// layouts on the heap starts a cache line.
	if got := unsafe.Sizeof(l); got < 1024 {
		t.Errorf("layouts is %d bytes: a size class below 1 KiB may not be 64-byte aligned", got)
	}
}

// oneIDByBytes is oneID read byte by byte: what the word operations must
// find.
func oneIDByBytes(w [8]byte) (uint32, int) {
	var v uint32
	n := 0
	for n < 8 && w[n] >= '0' && w[n] <= '9' {
		v = v*10 + uint32(w[n]-'0')
		n++
	}
	if n == 0 || n == 8 || w[n] != ']' || (n > 1 && w[0] == '0') {
		return 0, 0
	}
	return v, n
}

// TestOneIDAgrees holds oneID to the byte loop: every id up to seven
// digits' edges with what may follow it, and words of the bytes its tests
// tell apart (digits' neighbours, bytes whose +6 carries).
func TestOneIDAgrees(t *testing.T) {
	check := func(w [8]byte) {
		t.Helper()
		x := binary.LittleEndian.Uint64(w[:])
		gv, gn := uint32(0), oneID(x)
		if gn > 0 {
			gv = idValue(x, gn)
		}
		wv, wn := oneIDByBytes(w)
		if gv != wv || gn != wn {
			t.Fatalf("oneID(%q) = %d, %d; want %d, %d", w[:], gv, gn, wv, wn)
		}
	}
	var w [8]byte
	for _, id := range []string{"0", "7", "00", "01", "10", "99", "100", "4294", "65535", "151643", "999999", "1000000", "9999999", "0123456", "12345678"} {
		for _, rest := range []string{"]}]}\n\n\n\n", "],", "", "]", "x]", "\xff]"} {
			copy(w[:], id+rest+"\x00\x00\x00\x00\x00\x00\x00\x00")
			check(w)
		}
	}
	randomWords(1, "0123456789]/:,[ \n\xfa\xff\x3f\x40\x2f\xb0\xb9", func(rng *rand.Rand, w [8]byte) {
		if rng.IntN(2) == 0 { // an id and its ']' more often than by chance
			n := 1 + rng.IntN(7)
			for k := range n {
				w[k] = '0' + byte(rng.IntN(10))
			}
			w[n] = ']'
		}
		check(w)
	})
}

// randomWords calls check with 2^20 words of the bytes of alphabet drawn
// from a generator seeded with seed (check may change its copy).
func randomWords(seed uint64, alphabet string, check func(*rand.Rand, [8]byte)) {
	rng := rand.New(rand.NewPCG(seed, seed))
	var w [8]byte
	for range 1 << 20 {
		for k := range w {
			w[k] = alphabet[rng.IntN(len(alphabet))]
		}
		check(rng, w)
	}
}

// TestPlainWordEndAgrees holds plainWordEnd to a byte loop over words of
// the bytes its tests tell apart, and every byte at every place.
func TestPlainWordEndAgrees(t *testing.T) {
	byBytes := func(w [8]byte) int {
		for k, c := range w {
			if c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
				return k
			}
		}
		return 8
	}
	check := func(w [8]byte) {
		t.Helper()
		if got, want := plainWordEnd(binary.LittleEndian.Uint64(w[:])), byBytes(w); got != want {
			t.Fatalf("plainWordEnd(%q) = %d, want %d", w[:], got, want)
		}
	}
	var w [8]byte
	for k := range w {
		for c := range 256 {
			copy(w[:], "abcdefgh")
			w[k] = byte(c)
			check(w)
		}
	}
	randomWords(3, "a \"\\\x00\x01\x1f\x20\x21\x7f\x80\x81\xff\x5b\x5d\x23", func(_ *rand.Rand, w [8]byte) { check(w) })
}

// TestStringEndAgrees holds stringEnd's word loop to the scanner: strings
// of every length around a word's, with a byte that ends or breaks the
// plain run at every place.
func TestStringEndAgrees(t *testing.T) {
	scan := func(b []byte) int {
		s := jsonx.Scanner{B: b, Lenient: true}
		if _, _, _, err := s.String(); err != nil {
			return -1
		}
		return s.I
	}
	for n := range 40 {
		for at := range n + 1 {
			for _, c := range []byte{'a', '"', '\\', 0x01, 0x80, 0xc3} {
				b := []byte("\"" + strings.Repeat("x", n) + "\",\"y\":1}")
				if at < n {
					b[1+at] = c
				}
				if got, want := stringEnd(b, 0), scan(b); got != want {
					t.Fatalf("stringEnd(%q) = %d, want %d", b, got, want)
				}
			}
		}
	}
}
