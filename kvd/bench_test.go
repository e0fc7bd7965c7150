package kvd

import (
	"fmt"
	"testing"
)

var benchSizes = []int{64 << 10, 1 << 20, 4 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// BenchmarkMemcpy is the baseline of the arena benchmarks: one copy of the
// same size between two buffers.
func BenchmarkMemcpy(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			src, dst := value(1, n), make([]byte, n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

// BenchmarkArenaGet: a client get over the shared arena — one UDS round
// trip for (offset, length, version), then the value copied out of the
// mapped slot with the seqlock check (Client.Get into a reused buffer).
func BenchmarkArenaGet(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			d := startDaemon(b, daemonOpts{arenaBytes: int64(8 * (n + 64))})
			c := dial(b, d, ClientOptions{SharedArena: true})
			k := key(1)
			if ok, reason, err := c.Set(ns, k, value(1, n), SetOptions{}); !ok || err != nil {
				b.Fatal(reason, err)
			}
			dst := make([]byte, 0, n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				v, _, ok, err := c.Get(ns, k, dst)
				if !ok || err != nil || len(v) != n {
					b.Fatal("get failed", err)
				}
			}
		})
	}
}

// BenchmarkArenaGetRef: the zero-copy get alone — the round trip that
// returns the slot reference, and the version check; no bytes move.
func BenchmarkArenaGetRef(b *testing.B) {
	n := 1 << 20
	d := startDaemon(b, daemonOpts{arenaBytes: int64(8 * (n + 64))})
	c := dial(b, d, ClientOptions{SharedArena: true})
	k := key(1)
	c.Set(ns, k, value(1, n), SetOptions{})
	b.ReportAllocs()
	for b.Loop() {
		ref, ok, err := c.GetRef(ns, k)
		if !ok || err != nil || !c.Valid(ref) {
			b.Fatal("get ref failed", err)
		}
	}
}

// BenchmarkArenaSet: a zero-copy set — set_reserve, the value copied into
// the leased slot, set_commit (two round trips and one copy).
func BenchmarkArenaSet(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			d := startDaemon(b, daemonOpts{arenaBytes: int64(8 * (n + 64))})
			c := dial(b, d, ClientOptions{SharedArena: true})
			v := value(1, n)
			keys := [][]byte{key(0), key(1), key(2), key(3)}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				if ok, reason, err := c.SetZeroCopy(ns, keys[i%4], v, SetOptions{}); !ok || err != nil {
					b.Fatal(reason, err)
				}
			}
		})
	}
}

// BenchmarkInlineSet: a set carrying the value in the frame (the path of
// clients without the arena), for comparison.
func BenchmarkInlineSet(b *testing.B) {
	n := 1 << 20
	d := startDaemon(b, daemonOpts{arenaBytes: int64(8 * (n + 64))})
	c := dial(b, d, ClientOptions{})
	v := value(1, n)
	b.SetBytes(int64(n))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if ok, reason, err := c.Set(ns, key(i%4), v, SetOptions{}); !ok || err != nil {
			b.Fatal(reason, err)
		}
	}
}

// BenchmarkRoundTrip: one small op (exists of one key) over the socket.
func BenchmarkRoundTrip(b *testing.B) {
	d := startDaemon(b, daemonOpts{arenaBytes: 1 << 20})
	c := dial(b, d, ClientOptions{SharedArena: true})
	keys := [][]byte{key(1)}
	var present []bool
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if present, err = c.Exists(ns, keys, present); err != nil {
			b.Fatal(err)
		}
	}
}
