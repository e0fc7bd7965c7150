package continuation

import (
	"bytes"
	"testing"
)

// TestVecEqualAgrees calls vecEqual itself, the assembly or the portable
// comparison, at every length from its least (32) across two rounds and
// the blocks after them, each byte differing at every place (its lowest
// and highest bit), from addresses at every offset of a 32-byte block.
func TestVecEqualAgrees(t *testing.T) {
	if !haveVecEqual && !idScanInGo {
		t.Skip("vecEqual is AVX2 assembly and this CPU has no AVX2")
	}
	buf := make([]byte, 2*(300+64))
	for n := 32; n <= 300; n++ {
		for off := range 33 {
			if off > 2 && off < 31 && n%7 != 0 {
				continue // every offset for some lengths, the edges for all
			}
			a, b := buf[off:off+n], buf[len(buf)/2+(off*5)%32:][:n]
			for i := range a {
				a[i] = byte(i*31 + n)
			}
			copy(b, a)
			if !vecEqual(&a[0], &b[0], n) {
				t.Fatalf("len %d, offset %d: the same bytes differ", n, off)
			}
			for at := range n {
				for _, bit := range []byte{0x01, 0x80} {
					b[at] ^= bit
					if vecEqual(&a[0], &b[0], n) {
						t.Fatalf("len %d, offset %d: %#x at %d not found", n, off, bit, at)
					}
					b[at] ^= bit
				}
			}
		}
	}
}

// TestSameFixedAgrees holds sameFixed to Go's comparison at every length
// up to past the vector's (a difference at each end and in the middle).
func TestSameFixedAgrees(t *testing.T) {
	for n := 0; n <= 200; n++ {
		a := bytes.Repeat([]byte(`{"id":"x","choices":[`), 10)[:n]
		b := bytes.Clone(a)
		if !sameFixed(a, b) {
			t.Fatalf("len %d: the same bytes differ", n)
		}
		for _, at := range []int{0, n / 2, n - 1} {
			if n == 0 {
				break
			}
			b[at]++
			if got, want := sameFixed(a, b), string(a) == string(b); got != want {
				t.Fatalf("len %d, %d changed: %v, want %v", n, at, got, want)
			}
			b[at]--
		}
	}
}
