package continuation

import (
	"bytes"
	"testing"
)

// idsEndBytewise is indexIDsEnd read byte by byte.
func idsEndBytewise(b []byte) int {
	for j, c := range b {
		if c < ' ' || c > '9' {
			return j
		}
	}
	return -1
}

// idStops are bytes indexIDsEnd stops at (the array's end, line breaks,
// those next to the range it reads through, non-ASCII), idPasses bytes it
// reads through (the range's ends among them).
const (
	idStops  = "]\n\r\x00\x1f:[a\x7f\x80\x99\x9a\xff"
	idPasses = " 9,0-\"."
)

// TestIDStop holds idStop to the range it stands for, every byte.
func TestIDStop(t *testing.T) {
	for c := range 256 {
		if got, want := idStop(byte(c)), c < ' ' || c > '9'; got != want {
			t.Fatalf("%#x: %v, want %v", c, got, want)
		}
	}
}

// TestIndexIDsEndAgrees puts each byte indexIDsEnd stops at at every
// offset of arrays of every length across the block and the round (four
// blocks) sizes, so that the rounds, the blocks, the tail and the edges
// between them are all read.
func TestIndexIDsEndAgrees(t *testing.T) {
	for n := 0; n <= 300; n++ {
		b := bytes.Repeat([]byte(idPasses), n)[:n]
		if got := indexIDsEnd(b); got != -1 {
			t.Fatalf("len %d, none: %d", n, got)
		}
		for at := range n {
			for _, c := range []byte(idStops) {
				b := bytes.Repeat([]byte("9,"), n)[:n]
				b[at] = c
				if at+1 < n {
					b[n-1] = ']' // a later one must not be found first
				}
				if got, want := indexIDsEnd(b), idsEndBytewise(b); got != want {
					t.Fatalf("len %d, %q at %d: %d, want %d", n, c, at, got, want)
				}
			}
		}
	}
}

// TestScanIDBlocksAgrees calls scanIDBlocks itself, the assembly or the
// portable loop (which idArrayEnd never reaches where haveIDScan is
// false): only whole 32-byte blocks are read, a byte past them is not
// found.
func TestScanIDBlocksAgrees(t *testing.T) {
	if !haveIDScan && !idScanInGo {
		t.Skip("scanIDBlocks is AVX2 assembly and this CPU has no AVX2")
	}
	for n := 32; n <= 300; n++ {
		for at := range n {
			b := bytes.Repeat([]byte(idPasses), n)[:n]
			b[at] = idStops[at%len(idStops)]
			if got, want := scanIDBlocks(&b[0], n), idsEndBytewise(b[:n&^31]); got != want {
				t.Fatalf("len %d, %q at %d: %d, want %d", n, b[at], at, got, want)
			}
		}
	}
}

func FuzzIndexIDsEnd(f *testing.F) {
	f.Add([]byte("[1,2,3]"))
	f.Add(bytes.Repeat([]byte("12345,"), 20))
	f.Add(append(bytes.Repeat([]byte("12345,"), 40), "6]}"...))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := indexIDsEnd(b), idsEndBytewise(b); got != want {
			t.Fatalf("%q: %d, want %d", b, got, want)
		}
	})
}
