package kvd

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"testing"
)

// The arena benchmarks, one value size per sub-benchmark. Single-op
// benchmarks (Memcpy, ArenaGet, ArenaSet) measure one value per
// iteration: per-op latency. Batch benchmarks (MemcpyBatch, ArenaGetBatch,
// ArenaSetBatch) move batchCount(n) distinct values per iteration, about
// 16 MiB: throughput. scripts/bench-kvd.sh prints the table of
// docs/performance.md from them.
var benchSizes = []int{4 << 10, 64 << 10, 1 << 20, 4 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// batchCount is how many values of n bytes one batch moves: about 16 MiB,
// at least 4 and at most 1024 values.
func batchCount(n int) int { return min(max((16<<20)/n, 4), 1024) }

// slotArena is a daemon whose arena holds count values of n bytes: pages
// (the size classes' unit) of one n-byte slot each, so that every size fits.
func slotArena(count, n int) daemonOpts {
	return daemonOpts{arenaBytes: int64(count * (n + 64)), storeOpt: func(o *StoreOptions) { o.SlotBytes = n + 64 }}
}

// BenchmarkMemcpy is the baseline of the single-op benchmarks: one copy of
// the same size between two buffers.
func BenchmarkMemcpy(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			src, dst := value(1, n), make([]byte, n)
			copy(dst, src) // fault the destination in, as the arena benchmarks' buffers are
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

// BenchmarkMemcpyBatch is the baseline of the batch benchmarks: the same
// number of values of the same size, each copied from its own source
// buffer into its own destination buffer (the same bytes and the same
// working set as a batch through the arena).
func BenchmarkMemcpyBatch(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			k := batchCount(n)
			src, dst := make([][]byte, k), make([][]byte, k)
			for i := range src {
				src[i], dst[i] = value(i, n), make([]byte, n)
				copy(dst[i], src[i])
			}
			b.SetBytes(int64(k * n))
			b.ReportAllocs()
			for b.Loop() {
				for i := range src {
					copy(dst[i], src[i])
				}
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
			d := startDaemon(b, slotArena(8, n))
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

// BenchmarkArenaGetBatch: batchCount(n) keys in one batch_get round trip
// answered with batch_get_shared_response, every value copied out of its
// slot by the client with the slot-header check (Client.BatchGetInto).
func BenchmarkArenaGetBatch(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			k := batchCount(n)
			d := startDaemon(b, slotArena(k+1, n))
			c := dial(b, d, ClientOptions{SharedArena: true})
			keys, vals := make([][]byte, k), make([][]byte, k)
			for i := range keys {
				keys[i], vals[i] = key(i), value(i, n)
			}
			var sr BatchSetResult
			if err := c.BatchSetZeroCopy(ns, keys, vals, SetOptions{}, &sr); err != nil || !allTrue(sr.Accepted) {
				b.Fatal("set", err, sr.Reasons)
			}
			var r BatchResult
			if err := c.BatchGetInto(ns, keys, &r); err != nil || !allTrue(r.Found) {
				b.Fatal("get", err)
			}
			for i := range vals {
				if !bytes.Equal(r.Values[i], vals[i]) {
					b.Fatal("wrong bytes")
				}
			}
			b.SetBytes(int64(k * n))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.BatchGetInto(ns, keys, &r); err != nil || !allTrue(r.Found) {
					b.Fatal("batch get failed", err)
				}
			}
		})
	}
}

func allTrue(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}

// BenchmarkArenaGetRef: the zero-copy get alone — the round trip that
// returns the slot reference, and the version check; no bytes move.
func BenchmarkArenaGetRef(b *testing.B) {
	n := 1 << 20
	d := startDaemon(b, slotArena(8, n))
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
			d := startDaemon(b, slotArena(8, n))
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

// BenchmarkArenaSetBatch: batchCount(n) values stored through leases with
// Client.BatchSetZeroCopy — the set_reserve requests pipelined, each value
// copied by the client into its leased slot, the set_commit requests
// pipelined (overwriting the same keys every iteration).
func BenchmarkArenaSetBatch(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			k := batchCount(n)
			// Room for the live batch and the one being written.
			d := startDaemon(b, slotArena(2*k+1, n))
			c := dial(b, d, ClientOptions{SharedArena: true})
			keys, vals := make([][]byte, k), make([][]byte, k)
			for i := range keys {
				keys[i], vals[i] = key(i), value(i, n)
			}
			var r BatchSetResult
			b.SetBytes(int64(k * n))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.BatchSetZeroCopy(ns, keys, vals, SetOptions{}, &r); err != nil || !allTrue(r.Accepted) {
					b.Fatal("batch set failed", err, r.Reasons)
				}
			}
			b.StopTimer()
			var g BatchResult
			if err := c.BatchGetInto(ns, keys, &g); err != nil {
				b.Fatal(err)
			}
			for i := range vals {
				if !bytes.Equal(g.Values[i], vals[i]) {
					b.Fatal("wrong bytes stored")
				}
			}
		})
	}
}

// BenchmarkInlineSet: a set carrying the value in the frame (the path of
// clients without the arena), for comparison.
func BenchmarkInlineSet(b *testing.B) {
	n := 1 << 20
	d := startDaemon(b, slotArena(8, n))
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

// BenchmarkRoundTripStats: stats, the other small op.
func BenchmarkRoundTripStats(b *testing.B) {
	d := startDaemon(b, daemonOpts{arenaBytes: 1 << 20})
	c := dial(b, d, ClientOptions{SharedArena: true})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Stats(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUDSPingPong is the round trip's baseline: a 4-byte length and
// a 40-byte payload (the size of an exists request) echoed over a Unix
// stream socket by a goroutine in this process, read the way the client
// and the daemon read (length, then payload), with nothing decoded.
func BenchmarkUDSPingPong(b *testing.B) {
	path := filepath.Join(b.TempDir(), "pp.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(c, buf[:4]); err != nil {
				return
			}
			n := binary.BigEndian.Uint32(buf)
			if _, err := io.ReadFull(c, buf[4:4+n]); err != nil {
				return
			}
			if _, err := c.Write(buf[:4+n]); err != nil {
				return
			}
		}
	}()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c.Close()
		ln.Close()
		<-done
	})
	msg := make([]byte, 44)
	binary.BigEndian.PutUint32(msg, 40)
	in := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, in[:4]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, in[4:44]); err != nil {
			b.Fatal(err)
		}
	}
}
