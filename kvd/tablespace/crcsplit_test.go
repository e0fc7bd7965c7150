package tablespace

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestCRC32Combine: the combined CRC of two parts is the CRC of the whole,
// for every split of random buffers, empty parts included.
func TestCRC32Combine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 64, 4096, 5000, 1 << 20} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		for _, cut := range []int{0, n / 3, n / 2, n} {
			if got, want := crc32Combine(crc(b[:cut]), crc(b[cut:]), n-cut), crc(b); got != want {
				t.Fatalf("n %d cut %d: combined %08x, want %08x", n, cut, got, want)
			}
		}
	}
}

// TestCopyCRC: split or not, busy helper or not, copyCRC copies and sums
// exactly as copy and crc do.
func TestCopyCRC(t *testing.T) {
	c := newCRCSplitter()
	defer c.close()
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{100, crcSplitMin - 1, crcSplitMin, 1 << 20, 1<<20 + 12345} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		dst := make([]byte, n+100)
		if got := c.copyCRC(dst, src); got != crc(src) || !bytes.Equal(dst[:n], src) {
			t.Fatalf("n %d: crc %08x want %08x, copy equal %v", n, got, crc(src), bytes.Equal(dst[:n], src))
		}
		if got := c.copyCRC(nil, src); got != crc(src) {
			t.Fatalf("n %d, no copy: crc %08x want %08x", n, got, crc(src))
		}
	}
	// Concurrent callers: some find the helper busy and do it all.
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	want := crc(src)
	done := make(chan bool)
	for range 4 {
		go func() {
			ok := true
			for range 20 {
				ok = ok && c.copyCRC(nil, src) == want
			}
			done <- ok
		}()
	}
	for range 4 {
		if !<-done {
			t.Fatal("a concurrent copyCRC got a wrong sum")
		}
	}
}

func FuzzCRC32Combine(f *testing.F) {
	f.Add([]byte("hello, world"), 5)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		if cut < 0 || cut > len(b) {
			return
		}
		if got, want := crc32Combine(crc(b[:cut]), crc(b[cut:]), len(b)-cut), crc(b); got != want {
			t.Fatalf("cut %d of %d: %08x want %08x", cut, len(b), got, want)
		}
	})
}
