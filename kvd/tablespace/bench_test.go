package tablespace

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
)

// Benchmarks for docs/performance.md; INFERA_TABLESPACE_BENCH_DIR picks the
// filesystem (default the test temp dir). Values fill a 1 MiB slot; up to
// 320 blocks fit without eviction.
func benchTablespace(b *testing.B, group bool) *Tablespace {
	dir := b.TempDir()
	if d := os.Getenv("INFERA_TABLESPACE_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "bench-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	ts, err := Open(Config{Paths: []string{dir}, Bytes: 320 << 20, SlotBytes: 1 << 20, ContainerBytes: 64 << 20,
		GroupCommit: group, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ts.Close() })
	return ts
}

func benchValue(ts *Tablespace) []byte {
	v := make([]byte, ts.MaxValueBytes())
	for i := range v {
		v[i] = byte(i * 31)
	}
	return v
}

// BenchmarkPut: one writer, every Put durable (data fdatasync + journal fdatasync).
func BenchmarkPut(b *testing.B) {
	ts := benchTablespace(b, false)
	v := benchValue(ts)
	b.SetBytes(int64(len(v)))
	b.ResetTimer()
	for i := range b.N {
		if err := ts.Put(fmt.Appendf(nil, "k%d", i), v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutGroupParallel: concurrent writers sharing syncs (GroupCommit).
func BenchmarkPutGroupParallel(b *testing.B) {
	ts := benchTablespace(b, true)
	v := benchValue(ts)
	var n atomic.Int64
	b.SetBytes(int64(len(v)))
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := ts.Put(fmt.Appendf(nil, "k%d", n.Add(1)), v); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGet: one reader over 256 stored blocks, reading in place.
func BenchmarkGet(b *testing.B) {
	ts := benchTablespace(b, true)
	v := benchValue(ts)
	blocks := min(256, b.N) // 256 blocks for the recorded runs, few for smoke runs
	for i := range blocks {
		if err := ts.Put(fmt.Appendf(nil, "k%d", i), v); err != nil {
			b.Fatal(err)
		}
	}
	keys := make([][]byte, blocks)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k%d", i)
	}
	dst := ts.ReadBuffer()
	b.SetBytes(int64(len(v)))
	b.ResetTimer()
	for i := range b.N {
		var err error
		if dst, err = ts.Get(keys[i%blocks], dst); err != nil {
			b.Fatal(err)
		}
	}
}
