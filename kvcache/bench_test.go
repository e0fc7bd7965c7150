package kvcache

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

var promptSizes = []int{2048, 8192, 32768}

const benchBlockSize = 16

func BenchmarkAppendBlockHashes(b *testing.B) {
	for _, n := range promptSizes {
		tokens := seqTokens(n, func(i int) uint32 { return uint32(i * 2654435761) })
		dst := make([]uint64, 0, n/benchBlockSize)
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(4 * n))
			for b.Loop() {
				dst = AppendBlockHashes(dst[:0], tokens, benchBlockSize)
			}
		})
	}
}

// benchFleet is an index of ~1M blocks across nw workers: worker i holds
// the first (i+1)/nw of a shared 32k-token prompt (so a lookup walks the
// whole prompt for the workers that hold most of it), and random 256-block
// chains fill the rest.
type benchFleet struct {
	idx     *Index
	ws      []*Worker
	prompt  []uint32
	hashes  []uint64
	indexed int
}

var (
	fleetsMu sync.Mutex
	fleets   = map[int]*benchFleet{}
)

func buildFleet(tb testing.TB, nw, total int, share bool) *benchFleet {
	idx := NewIndex(IndexConfig{MaxBlocks: total + total/8})
	f := &benchFleet{idx: idx, ws: make([]*Worker, nw)}
	f.prompt = seqTokens(promptSizes[len(promptSizes)-1], func(i int) uint32 { return uint32(i*7 + 3) })
	f.hashes = AppendBlockHashes(nil, f.prompt, benchBlockSize)
	engine := uint64(1)
	var batch Batch
	apply := func(w *Worker, tokens []uint32) {
		n := len(tokens) / benchBlockSize
		hs := make([]uint64, n)
		for j := range hs {
			hs[j] = engine
			engine++
		}
		batch.Events = append(batch.Events[:0], Event{Type: EventBlockStored, Hashes: hs, Tokens: tokens, BlockSize: benchBlockSize})
		f.indexed += idx.Apply(w, &batch).Stored
	}
	for i := range f.ws {
		w, err := idx.Register(Key{Worker: fmt.Sprintf("10.0.0.%d:8000", i)}, benchBlockSize)
		if err != nil {
			tb.Fatal(err)
		}
		f.ws[i] = w
		apply(w, f.prompt[:len(f.prompt)*(i+1)/nw/benchBlockSize*benchBlockSize])
	}
	rng := rand.New(rand.NewPCG(7, uint64(nw)))
	chain := make([]uint32, 256*benchBlockSize)
	shared := make([]uint32, 256*benchBlockSize)
	for k := 0; f.indexed < total; k++ {
		if share && k%4 != 0 {
			// Three in four chains repeat an earlier chain on another
			// worker: each router hash is then held by ~4 workers.
			copy(chain, shared)
		} else {
			for j := range chain {
				chain[j] = rng.Uint32()
			}
			copy(shared, chain)
		}
		apply(f.ws[k%nw], chain)
	}
	return f
}

func fleet(b *testing.B, nw int) *benchFleet {
	fleetsMu.Lock()
	defer fleetsMu.Unlock()
	if f, ok := fleets[nw]; ok {
		return f
	}
	f := buildFleet(b, nw, 1<<20, false)
	fleets[nw] = f
	return f
}

func BenchmarkMatchMany(b *testing.B) {
	for _, nw := range []int{16, 64, 256} {
		for _, n := range promptSizes {
			b.Run(fmt.Sprintf("workers=%d/tokens=%d", nw, n), func(b *testing.B) {
				f := fleet(b, nw)
				hashes := f.hashes[:n/benchBlockSize]
				out := make([]int, nw)
				b.ReportAllocs()
				for b.Loop() {
					f.idx.MatchMany(f.ws, hashes, out)
				}
				if out[nw-1] != len(hashes) {
					b.Fatalf("last worker matched %d of %d", out[nw-1], len(hashes))
				}
				b.ReportMetric(float64(f.indexed), "indexed_blocks")
			})
		}
	}
}

// BenchmarkMatchEach is the per-worker alternative MatchMany replaces.
func BenchmarkMatchEach(b *testing.B) {
	for _, nw := range []int{16, 64} {
		n := 8192
		b.Run(fmt.Sprintf("workers=%d/tokens=%d", nw, n), func(b *testing.B) {
			f := fleet(b, nw)
			hashes := f.hashes[:n/benchBlockSize]
			b.ReportAllocs()
			for b.Loop() {
				for _, w := range f.ws {
					f.idx.Match(w, hashes)
				}
			}
		})
	}
}

// BenchmarkMatchManyParallel: concurrent pickers against one index.
func BenchmarkMatchManyParallel(b *testing.B) {
	f := fleet(b, 64)
	hashes := f.hashes[:8192/benchBlockSize]
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]int, len(f.ws))
		for pb.Next() {
			f.idx.MatchMany(f.ws, hashes, out)
		}
	})
}

// BenchmarkIndexBytesPerBlock measures live heap per indexed (worker, block)
// entry with 1M entries over 64 workers: all hashes distinct, and with each
// hash held by ~4 workers (shared prefixes).
func BenchmarkIndexBytesPerBlock(b *testing.B) {
	for _, share := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared=%v", share), func(b *testing.B) {
			var perBlock float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				f := buildFleet(b, 64, 1<<20, share)
				runtime.GC()
				runtime.ReadMemStats(&after)
				perBlock = float64(after.HeapAlloc-before.HeapAlloc) / float64(f.indexed)
				runtime.KeepAlive(f)
			}
			b.ReportMetric(perBlock, "bytes/block")
		})
	}
}

// applyStream is a cycle of vLLM-array payloads: each batch stores a 4-block
// chain extending the previous batch's and removes the blocks stored 8
// batches earlier, so the index stays at a steady size.
func applyStream(tb testing.TB) [][]byte {
	const cycle, perBatch, window = 1024, 4, 8
	payloads := make([][]byte, cycle)
	eh := func(k, j int) uint64 { return uint64(k*perBatch + j + 1) }
	rng := rand.New(rand.NewPCG(3, 4))
	for k := range cycle {
		hashes := make([]uint64, perBatch)
		for j := range hashes {
			hashes[j] = eh(k, j)
		}
		var parent any
		if k > 0 {
			parent = eh(k-1, perBatch-1)
		}
		tokens := make([]uint32, perBatch*benchBlockSize)
		for j := range tokens {
			tokens[j] = rng.Uint32N(150000)
		}
		old := (k - window + cycle) % cycle
		rm := make([]uint64, perBatch)
		for j := range rm {
			rm[j] = eh(old, j)
		}
		payloads[k] = mp(tb, []any{1.0, []any{
			arrStored(hashes, parent, tokens, benchBlockSize, nil, "GPU", nil, nil, 0, "full_attention"),
			arrRemoved(rm, "GPU", 0),
		}, 0})
	}
	return payloads
}

// BenchmarkApplyEvents decodes and applies one batch (2 events, 8 blocks)
// per op, as a subscriber stream does.
func BenchmarkApplyEvents(b *testing.B) {
	payloads := applyStream(b)
	idx := NewIndex(IndexConfig{MaxBlocks: 1 << 16})
	w, _ := idx.Register(Key{Worker: "w"}, benchBlockSize)
	d := NewDecoder()
	var batch Batch
	b.ReportAllocs()
	events := 0
	k := 0
	for b.Loop() {
		if err := d.Decode(payloads[k], &batch); err != nil {
			b.Fatal(err)
		}
		idx.Apply(w, &batch)
		events += len(batch.Events)
		k = (k + 1) % len(payloads)
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(events*4)/b.Elapsed().Seconds(), "blocks/s")
}

func BenchmarkDecode(b *testing.B) {
	payloads := applyStream(b)
	d := NewDecoder()
	var batch Batch
	b.ReportAllocs()
	k := 0
	for b.Loop() {
		if err := d.Decode(payloads[k], &batch); err != nil {
			b.Fatal(err)
		}
		k = (k + 1) % len(payloads)
	}
}
