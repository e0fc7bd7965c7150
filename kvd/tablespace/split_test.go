package tablespace

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

func TestCRCCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	lens := []int{0, 1, 7, 4095, 4096, 4097, 100_000, 1 << 20}
	for _, la := range lens {
		for _, lb := range lens {
			a, b := make([]byte, la), make([]byte, lb)
			for i := range a {
				a[i] = byte(rng.Uint32())
			}
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			want := crc32.Update(crc(a), castagnoli, b)
			if got := crcCombine(crc(a), crc(b), lb); got != want {
				t.Fatalf("combine %d+%d: %08x, want %08x", la, lb, got, want)
			}
		}
	}
}

func TestPartition(t *testing.T) {
	for _, n := range []int{0, 1, 2*minPart - 1, 2 * minPart, 2*minPart + 1, 1 << 20, 1<<20 - 4096, 3 << 20} {
		parts, size := partition(n)
		if n < 2*minPart {
			if parts != 1 {
				t.Fatalf("%d: %d parts", n, parts)
			}
			continue
		}
		if parts < 2 || parts > maxParts || size%ioAlign != 0 || (parts-1)*size >= n || parts*size < n {
			t.Fatalf("%d: %d parts of %d", n, parts, size)
		}
	}
}

// withMinPart makes small slots move in parts for the test.
func withMinPart(t *testing.T, n int) {
	old := minPart
	minPart = n
	t.Cleanup(func() { minPart = old })
}

func splitConfig(dir string) Config {
	return Config{Paths: []string{dir}, Bytes: 16 << 16, SlotBytes: 1 << 16, ContainerBytes: 4 << 16, Logger: zerolog.Nop()}
}

// Values of every length class round-trip through parted reads and
// copies, with readers competing for the helpers (so parts also run on
// the caller), into a ReadBuffer and into an unaligned buffer.
func TestSplitRoundTrip(t *testing.T) {
	withMinPart(t, 4096)
	ts := mustOpen(t, splitConfig(t.TempDir()))
	defer ts.Close()
	lens := []int{1, 4095, 8191, 8192, 8193, 20_000, 40_000, ts.MaxValueBytes()}
	vals := make([][]byte, len(lens))
	for i, n := range lens {
		vals[i] = make([]byte, n)
		for j := range vals[i] {
			vals[i][j] = byte(j*13 + i)
		}
		if err := ts.Put(fmt.Appendf(nil, "k%d", i), vals[i]); err != nil {
			t.Fatal(err)
		}
	}
	if parts, _ := partition(ts.MaxValueBytes()); parts != maxParts {
		t.Fatalf("largest value in %d parts, want %d", parts, maxParts)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rb, small := ts.ReadBuffer(), make([]byte, 0, 100)
			for r := range 20 {
				i := (g + r) % len(lens)
				dst := rb
				if r%2 == 1 {
					dst = small
				}
				got, err := ts.Get(fmt.Appendf(nil, "k%d", i), dst)
				if err != nil || !bytes.Equal(got, vals[i]) {
					t.Errorf("k%d (%d bytes): %v, %d bytes back", i, lens[i], err, len(got))
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A damaged byte in any part of a parted slot is found.
func TestSplitDetectsDamageInEveryPart(t *testing.T) {
	withMinPart(t, 4096)
	ts := mustOpen(t, splitConfig(t.TempDir()))
	defer ts.Close()
	v := make([]byte, ts.MaxValueBytes())
	for i := range v {
		v[i] = byte(i * 7)
	}
	parts, size := partition(alignUp(len(v) + slotHeaderSize + 1))
	s0 := ts.shards[0]
	for p := range parts {
		key := fmt.Appendf(nil, "%c", 'a'+p)
		if err := ts.Put(key, v); err != nil {
			t.Fatal(err)
		}
		c, off := s0.locate(s0.index[string(key)])
		f, err := os.OpenFile(filepath.Join(s0.dir, "containers", fmt.Sprintf("%04d.bin", c)), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{0xee}, off+int64(p*size+5)); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		if got, err := ts.Get(key, ts.ReadBuffer()); !errors.Is(err, ErrCorrupt) || len(got) != 0 {
			t.Fatalf("damage in part %d of %d: %v, %d bytes", p, parts, err, len(got))
		}
	}
	if n := ts.Stats().Corrupt; n != uint64(parts) {
		t.Fatalf("%d corrupt, want %d", n, parts)
	}
}

// Gets and Puts of a full 1 MiB slot, moved in parts, allocate nothing.
func TestSplitAllocs(t *testing.T) {
	ts := mustOpen(t, Config{Paths: []string{t.TempDir()}, Bytes: 4 << 20, SlotBytes: 1 << 20, ContainerBytes: 4 << 20,
		Logger: zerolog.Nop()})
	defer ts.Close()
	v := make([]byte, ts.MaxValueBytes())
	for i := range v {
		v[i] = byte(i)
	}
	key := []byte("big")
	if err := ts.Put(key, v); err != nil {
		t.Fatal(err)
	}
	dst := ts.ReadBuffer()
	if n := testing.AllocsPerRun(20, func() { dst, _ = ts.Get(key, dst) }); n != 0 {
		t.Fatalf("parted get allocates %v", n)
	}
	if !bytes.Equal(dst, v) {
		t.Fatal("wrong bytes")
	}
	if n := testing.AllocsPerRun(10, func() { _ = ts.Put(key, v) }); n != 0 {
		t.Fatalf("parted put allocates %v", n)
	}
}
