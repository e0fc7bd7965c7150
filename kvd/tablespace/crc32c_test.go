package tablespace

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCRCUpdate: crcUpdate equals hash/crc32's Castagnoli for every length
// around the fold's boundaries, any start value and any alignment.
func TestCRCUpdate(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 1))
	buf := make([]byte, 3<<20)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	t.Logf("folding: %v", haveFold)
	lens := []int{0, 1, 15, 255, 256, 257, foldMin - 1, foldMin, foldMin + 1, 1279, 1280, 1281, 4096, 65536 + 17, 1<<20 - 5000, 1 << 20, 2<<20 + 99}
	for range 200 {
		lens = append(lens, rng.IntN(1<<16))
	}
	for _, n := range lens {
		for _, off := range []int{0, 1, 13, 64} {
			p := buf[off : off+n]
			for _, c := range []uint32{0, 0xFFFFFFFF, rng.Uint32()} {
				if got, want := crcUpdate(c, p), crc32.Update(c, castagnoli, p); got != want {
					t.Fatalf("len %d off %d start %#x: %#x, want %#x", n, off, c, got, want)
				}
			}
		}
	}
}

func TestCRCUpdateAlloc(t *testing.T) {
	p := make([]byte, 1<<20)
	if n := testing.AllocsPerRun(10, func() { crcUpdate(0, p) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func FuzzCRCUpdate(f *testing.F) {
	f.Add([]byte("123456789"), uint32(0))
	f.Add(make([]byte, 3000), uint32(0xFFFFFFFF))
	f.Fuzz(func(t *testing.T, p []byte, c uint32) {
		if got, want := crcUpdate(c, p), crc32.Update(c, castagnoli, p); got != want {
			t.Fatalf("len %d start %#x: %#x, want %#x", len(p), c, got, want)
		}
	})
}

func BenchmarkCRC(b *testing.B) {
	p := make([]byte, 1<<20)
	b.Run("crc32", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			crc32.Update(0, castagnoli, p)
		}
	})
	b.Run("crcUpdate", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			crcUpdate(0, p)
		}
	})
}
