package continuation

import (
	"bytes"
	"testing"
)

// idsEndBytewise is indexIDsEnd read byte by byte.
func idsEndBytewise(b []byte) int {
	for j, c := range b {
		if c == ']' || c == '\n' || c == '\r' {
			return j
		}
	}
	return -1
}

// TestIndexIDsEndAgrees puts each byte indexIDsEnd looks for at every
// offset of arrays of every length across the block size, so that the
// blocks, the tail and the edge between them are all read.
func TestIndexIDsEndAgrees(t *testing.T) {
	for n := 0; n <= 100; n++ {
		b := bytes.Repeat([]byte("1,"), n)[:n]
		if got := indexIDsEnd(b); got != -1 {
			t.Fatalf("len %d, none: %d", n, got)
		}
		for at := range n {
			for _, c := range []byte("]\n\r") {
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
	for n := 32; n <= 130; n++ {
		for at := range n {
			b := bytes.Repeat([]byte("7,"), n)[:n]
			b[at] = "]\n\r"[at%3]
			if got, want := scanIDBlocks(&b[0], n), idsEndBytewise(b[:n&^31]); got != want {
				t.Fatalf("len %d, %q at %d: %d, want %d", n, b[at], at, got, want)
			}
		}
	}
}

func FuzzIndexIDsEnd(f *testing.F) {
	f.Add([]byte("[1,2,3]"))
	f.Add(bytes.Repeat([]byte("12345,"), 20))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := indexIDsEnd(b), idsEndBytewise(b); got != want {
			t.Fatalf("%q: %d, want %d", b, got, want)
		}
	})
}
