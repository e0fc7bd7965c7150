package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// stored builds a decoded BlockStored event directly.
func stored(hashes []uint64, parent *uint64, tokens []uint32, bs int) Event {
	e := Event{Type: EventBlockStored, Hashes: hashes, Tokens: tokens, BlockSize: bs}
	if parent != nil {
		e.Parent, e.HasParent = *parent, true
	}
	return e
}

func removed(hashes ...uint64) Event { return Event{Type: EventBlockRemoved, Hashes: hashes} }

func ptr(v uint64) *uint64 { return &v }

func batchOf(evs ...Event) *Batch { return &Batch{Events: evs} }

func mustRegister(t testing.TB, x *Index, name string, bs int) *Worker {
	t.Helper()
	w, err := x.Register(Key{Worker: name}, bs)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestIndexStoreChainMatchRemove(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocks: 1000})
	w := mustRegister(t, x, "w1", 4)
	tokens := seqTokens(14, func(i int) uint32 { return uint32(100 + i) })
	want := AppendBlockHashes(nil, tokens, 4) // 3 full blocks

	// Engine stores blocks 0-1 (engine hashes 501, 502), then block 2 as a
	// child of 502 in a later event.
	res := x.Apply(w, batchOf(
		stored([]uint64{501, 502}, nil, tokens[:8], 4),
		stored([]uint64{503}, ptr(502), tokens[8:12], 4),
	))
	if res.Stored != 3 || w.Blocks() != 3 {
		t.Fatalf("res %+v blocks %d", res, w.Blocks())
	}
	if got := x.Match(w, want); got != 3 {
		t.Fatalf("match %d, want 3", got)
	}
	// A request diverging in block 1 matches only block 0.
	other := slices.Clone(tokens)
	other[5] = 9
	if got := x.Match(w, AppendBlockHashes(nil, other, 4)); got != 1 {
		t.Fatalf("diverging match %d, want 1", got)
	}
	// Re-store refreshes without duplicating.
	res = x.Apply(w, batchOf(stored([]uint64{501}, nil, tokens[:4], 4)))
	if res.Refreshed != 1 || w.Blocks() != 3 {
		t.Fatalf("re-store: %+v blocks %d", res, w.Blocks())
	}
	// Removing the middle block cuts the prefix there.
	res = x.Apply(w, batchOf(removed(502, 999)))
	if res.Removed != 1 || res.UnknownRemove != 1 || w.Blocks() != 2 {
		t.Fatalf("remove: %+v blocks %d", res, w.Blocks())
	}
	if got := x.Match(w, want); got != 1 {
		t.Fatalf("after remove match %d, want 1", got)
	}
	// A new child of the removed block cannot be hashed any more: dropped.
	res = x.Apply(w, batchOf(stored([]uint64{504}, ptr(502), tokens[8:12], 4)))
	if res.UnknownParent != 1 {
		t.Fatalf("child of removed parent: %+v", res)
	}
	res = x.Apply(w, batchOf(Event{Type: EventAllBlocksCleared}))
	if res.Cleared != 1 || w.Blocks() != 0 || x.Match(w, want) != 0 {
		t.Fatalf("clear: %+v blocks %d", res, w.Blocks())
	}
}

func TestIndexUnknownParentDropped(t *testing.T) {
	x := NewIndex(IndexConfig{})
	w := mustRegister(t, x, "w", 2)
	res := x.Apply(w, batchOf(stored([]uint64{7, 8}, ptr(6), []uint32{1, 2, 3, 4}, 2)))
	if res.UnknownParent != 2 || res.Stored != 0 || w.Blocks() != 0 {
		t.Fatalf("%+v", res)
	}
}

func TestIndexBlockSize(t *testing.T) {
	x := NewIndex(IndexConfig{})
	w := mustRegister(t, x, "learn", 0)
	x.Apply(w, batchOf(stored([]uint64{1}, nil, []uint32{1, 2, 3}, 3)))
	if w.BlockSize() != 3 || w.Blocks() != 1 {
		t.Fatalf("learned %d blocks %d", w.BlockSize(), w.Blocks())
	}
	res := x.Apply(w, batchOf(stored([]uint64{2}, nil, []uint32{1, 2}, 2)))
	if res.Skipped != 1 {
		t.Fatalf("mismatched block size: %+v", res)
	}
	if _, err := x.Register(Key{Worker: "bad"}, -1); err == nil {
		t.Fatal("negative block size accepted")
	}
}

func TestIndexIgnoredAndNonAttentionRemovals(t *testing.T) {
	x := NewIndex(IndexConfig{})
	w := mustRegister(t, x, "w", 2)
	toks := []uint32{1, 2}
	full := stored([]uint64{42}, nil, toks, 2)
	full.Group, full.HasGroup = 0, true
	swa := stored([]uint64{42}, nil, toks, 2)
	swa.Group, swa.HasGroup, swa.Ignore = 1, true, IgnoreKind
	res := x.Apply(w, batchOf(full, swa))
	if res.Stored != 1 || res.Skipped != 1 {
		t.Fatalf("%+v", res)
	}
	// The sliding-window group evicting its copy must not remove ours.
	rm := removed(42)
	rm.Group, rm.HasGroup = 1, true
	res = x.Apply(w, batchOf(rm))
	if res.Removed != 0 || w.Blocks() != 1 {
		t.Fatalf("swa removal applied: %+v", res)
	}
	rm.Group = 0
	if res = x.Apply(w, batchOf(rm)); res.Removed != 1 || w.Blocks() != 0 {
		t.Fatalf("attention removal: %+v", res)
	}
	lora := stored([]uint64{43}, nil, toks, 2)
	lora.Ignore = IgnoreLoRA
	if res = x.Apply(w, batchOf(lora)); res.Skipped != 1 || w.Blocks() != 0 {
		t.Fatalf("lora: %+v", res)
	}
}

func TestIndexMatchMany(t *testing.T) {
	x := NewIndex(IndexConfig{})
	tokens := seqTokens(64, func(i int) uint32 { return uint32(i) })
	hashes := AppendBlockHashes(nil, tokens, 8) // 8 blocks
	ws := make([]*Worker, 5)
	for i, n := range []int{8, 3, 0, 5, 1} {
		ws[i] = mustRegister(t, x, string(rune('a'+i)), 8)
		if n > 0 {
			engine := make([]uint64, n)
			for j := range engine {
				engine[j] = uint64(1000*i + j)
			}
			x.Apply(ws[i], batchOf(stored(engine, nil, tokens[:n*8], 8)))
		}
	}
	gone := mustRegister(t, x, "gone", 8)
	x.Apply(gone, batchOf(stored([]uint64{1}, nil, tokens[:8], 8)))
	x.Unregister(gone)

	query := append(slices.Clone(ws), nil, gone)
	out := make([]int, len(query))
	x.MatchMany(query, hashes, out)
	if want := []int{8, 3, 0, 5, 1, 0, 0}; !slices.Equal(out, want) {
		t.Fatalf("MatchMany %v, want %v", out, want)
	}
	for i, w := range ws {
		if got := x.Match(w, hashes); got != out[i] {
			t.Fatalf("Match(%d) = %d, MatchMany %d", i, got, out[i])
		}
	}
	if x.Match(gone, hashes) != 0 || x.Match(nil, hashes) != 0 {
		t.Fatal("stale handle matched")
	}
	// A short out slice only fills what fits.
	short := make([]int, 2)
	x.MatchMany(ws, hashes, short)
	if !slices.Equal(short, []int{8, 3}) {
		t.Fatalf("short out %v", short)
	}
}

func TestIndexMatchManyRandomAgainstMatch(t *testing.T) {
	for _, nw := range []int{20, 64, 80, 300} {
		t.Run(fmt.Sprintf("workers=%d", nw), func(t *testing.T) { testMatchManyRandom(t, nw) })
	}
}

func testMatchManyRandom(t *testing.T, nw int) {
	rng := rand.New(rand.NewPCG(1, uint64(nw)))
	x := NewIndex(IndexConfig{MaxBlocks: 5000})
	ws := make([]*Worker, nw)
	for i := range ws {
		ws[i] = mustRegister(t, x, fmt.Sprint(i), 4)
	}
	prompts := make([][]uint32, 6)
	for p := range prompts {
		prompts[p] = seqTokens(4*30, func(i int) uint32 {
			if i < 40 { // shared system prompt
				return uint32(i)
			}
			return uint32(p*100000 + i)
		})
	}
	next := uint64(1)
	for range 1500 {
		w := ws[rng.IntN(nw)]
		p := prompts[rng.IntN(len(prompts))]
		n := 1 + rng.IntN(30)
		engine := make([]uint64, n)
		for j := range engine {
			engine[j] = next
			next++
		}
		x.Apply(w, batchOf(stored(engine, nil, p[:4*n], 4)))
		if rng.IntN(4) == 0 {
			x.Apply(w, batchOf(removed(engine[rng.IntN(n)])))
		}
		if rng.IntN(50) == 0 {
			x.Clear(w)
		}
	}
	// Query up to 64 workers drawn from every group, plus a nil and a
	// duplicate.
	query := slices.Clone(ws)
	rng.Shuffle(len(query), func(i, j int) { query[i], query[j] = query[j], query[i] })
	query = append(query[:min(len(query), 64)], nil, query[0])
	out := make([]int, len(query))
	hits := 0
	for _, p := range prompts {
		h := AppendBlockHashes(nil, p, 4)
		x.MatchMany(query, h, out)
		for i, w := range query {
			if got := x.Match(w, h); got != out[i] {
				t.Fatalf("query %d: Match %d MatchMany %d", i, got, out[i])
			}
			hits += out[i]
		}
	}
	if hits == 0 {
		t.Fatal("nothing matched: the test exercises nothing")
	}
}

func TestIndexLRUEviction(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocks: 4})
	w := mustRegister(t, x, "w", 1)
	chain := func(base uint32, engine uint64) []uint64 {
		x.Apply(w, batchOf(stored([]uint64{engine, engine + 1}, nil, []uint32{base, base + 1}, 1)))
		return AppendBlockHashes(nil, []uint32{base, base + 1}, 1)
	}
	a := chain(10, 100)
	b := chain(20, 200)
	if x.Len() != 4 || x.Match(w, a) != 2 || x.Match(w, b) != 2 {
		t.Fatalf("len %d", x.Len())
	}
	c := chain(30, 300) // evicts a: leaf first, then its root
	if x.Len() != 4 || w.Blocks() != 4 || x.Match(w, a) != 0 || x.Match(w, b) != 2 || x.Match(w, c) != 2 {
		t.Fatalf("after c: len %d a %d b %d c %d", x.Len(), x.Match(w, a), x.Match(w, b), x.Match(w, c))
	}
	x.Touch(w, b) // b is now the most recent
	d := chain(40, 400)
	if x.Match(w, c) != 0 || x.Match(w, b) != 2 || x.Match(w, d) != 2 {
		t.Fatalf("after touch+d: b %d c %d d %d", x.Match(w, b), x.Match(w, c), x.Match(w, d))
	}
	// Evicted blocks left the engine map too: a child of c's root is dropped.
	if res := x.Apply(w, batchOf(stored([]uint64{301}, ptr(300), []uint32{31}, 1))); res.UnknownParent != 1 {
		t.Fatalf("child of evicted: %+v", res)
	}
	e := chain(50, 500) // evicts b
	if x.Match(w, b) != 0 || x.Match(w, d) != 2 || x.Match(w, e) != 2 {
		t.Fatalf("after e: b %d d %d e %d", x.Match(w, b), x.Match(w, d), x.Match(w, e))
	}
	// Evicting a single block takes d's leaf, not its root, so d still
	// matches one block.
	x.Apply(w, batchOf(stored([]uint64{600}, nil, []uint32{60}, 1)))
	if got := x.Match(w, d); got != 1 {
		t.Fatalf("d after one eviction: %d, want 1 (leaf first)", got)
	}
}

func TestIndexUnregisterAndSlotReuse(t *testing.T) {
	x := NewIndex(IndexConfig{})
	w := mustRegister(t, x, "w", 1)
	h := AppendBlockHashes(nil, []uint32{1, 2}, 1)
	x.Apply(w, batchOf(stored([]uint64{1, 2}, nil, []uint32{1, 2}, 1)))
	x.Unregister(w)
	x.Unregister(w) // idempotent
	if _, ok := x.Lookup(Key{Worker: "w"}); ok {
		t.Fatal("still registered")
	}
	if res := x.Apply(w, batchOf(stored([]uint64{3}, nil, []uint32{3}, 1))); res != (ApplyResult{}) {
		t.Fatalf("apply to unregistered: %+v", res)
	}
	w2 := mustRegister(t, x, "w2", 1) // reuses the slot
	if w2.slot != w.slot {
		t.Fatalf("slot not reused: %d vs %d", w2.slot, w.slot)
	}
	if x.Match(w2, h) != 0 || x.Match(w, h) != 0 || w2.Blocks() != 0 {
		t.Fatal("new owner of a slot sees the old owner's blocks")
	}
	if x.Len() != 0 {
		t.Fatalf("unregistered worker's blocks still held: %d", x.Len())
	}
	again, _ := x.Register(Key{Worker: "w2"}, 0)
	if again != w2 {
		t.Fatal("Register is not idempotent")
	}
}

func TestIndexEvictsFromLargestWorker(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocks: 10})
	big := mustRegister(t, x, "big", 1)
	small := mustRegister(t, x, "small", 1)
	bigTokens := seqTokens(8, func(i int) uint32 { return uint32(i) })
	x.Apply(big, batchOf(stored([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, nil, bigTokens, 1)))
	x.Apply(small, batchOf(stored([]uint64{1, 2}, nil, []uint32{100, 101}, 1)))
	// Full. Four more blocks on small evict big's leaves, not small's.
	x.Apply(small, batchOf(stored([]uint64{3, 4, 5, 6}, ptr(2), []uint32{102, 103, 104, 105}, 1)))
	if x.Len() != 10 || big.Blocks() != 4 || small.Blocks() != 6 {
		t.Fatalf("len %d big %d small %d", x.Len(), big.Blocks(), small.Blocks())
	}
	if got := x.Match(big, AppendBlockHashes(nil, bigTokens, 1)); got != 4 {
		t.Fatalf("big kept prefix %d, want 4 (leaves evicted first)", got)
	}
	// Once small is the largest, it pays for its own growth.
	x.Apply(small, batchOf(stored([]uint64{7}, ptr(6), []uint32{106}, 1)))
	if big.Blocks() != 4 || small.Blocks() != 6 {
		t.Fatalf("big %d small %d", big.Blocks(), small.Blocks())
	}
}

func TestIndexSlotsStayPackedUnderChurn(t *testing.T) {
	x := NewIndex(IndexConfig{})
	ws := make([]*Worker, 64)
	for i := range ws {
		ws[i] = mustRegister(t, x, string(rune(0x100+i)), 1)
	}
	for range 10 {
		x.Unregister(ws[7])
		ws[7] = mustRegister(t, x, "replacement", 1)
		if x.groups[1].Load() != nil {
			t.Fatal("slot churn opened a second group")
		}
	}
	if w := mustRegister(t, x, "65th", 1); w.slot != 64 || x.groups[1].Load() == nil {
		t.Fatalf("65th worker: slot %d", w.slot)
	}
}

func TestIndexTooManyWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("registers 65535 workers")
	}
	x := NewIndex(IndexConfig{})
	for i := range maxSlots {
		if _, err := x.Register(Key{Worker: "w", DPRank: i}, 1); err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	if _, err := x.Register(Key{Worker: "one-more"}, 1); err == nil {
		t.Fatal("no error past the slot limit")
	}
}

func TestIndexMatchZeroAlloc(t *testing.T) {
	x := NewIndex(IndexConfig{})
	tokens := seqTokens(256, func(i int) uint32 { return uint32(i) })
	hashes := AppendBlockHashes(nil, tokens, 16)
	ws := make([]*Worker, 64)
	for i := range ws {
		ws[i] = mustRegister(t, x, string(rune(0x100+i)), 16)
		n := 1 + i%16
		engine := make([]uint64, n)
		for j := range engine {
			engine[j] = uint64(i*100 + j)
		}
		x.Apply(ws[i], batchOf(stored(engine, nil, tokens[:16*n], 16)))
	}
	out := make([]int, len(ws))
	x.MatchMany(ws, hashes, out) // warm the scratch pool
	if a := testing.AllocsPerRun(100, func() { x.MatchMany(ws, hashes, out) }); a != 0 {
		t.Fatalf("MatchMany: %v allocs", a)
	}
	if a := testing.AllocsPerRun(100, func() { x.Match(ws[3], hashes) }); a != 0 {
		t.Fatalf("Match: %v allocs", a)
	}
	for i := range ws {
		if out[i] != 1+i%16 {
			t.Fatalf("worker %d: %d", i, out[i])
		}
	}
}

// TestIndexConcurrent runs readers against writers for the race detector.
func TestIndexConcurrent(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocks: 2000})
	tokens := seqTokens(512, func(i int) uint32 { return uint32(i % 97) })
	hashes := AppendBlockHashes(nil, tokens, 8)
	ws := make([]*Worker, 8)
	for i := range ws {
		ws[i] = mustRegister(t, x, string(rune('a'+i)), 8)
	}
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]int, len(ws))
			for range 300 {
				x.MatchMany(ws, hashes, out)
				x.Match(ws[r], hashes)
				_ = ws[r].Blocks()
			}
		}()
	}
	var wwg sync.WaitGroup
	for i, w := range ws {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			base := uint64(i) << 32
			for k := range 100 {
				n := 1 + k%60
				engine := make([]uint64, n)
				for j := range engine {
					engine[j] = base + uint64(k*64+j)
				}
				x.Apply(w, batchOf(stored(engine, nil, tokens[:8*n], 8)))
				switch k % 7 {
				case 3:
					x.Apply(w, batchOf(removed(engine[n/2])))
				case 5:
					x.Touch(w, hashes[:n])
				case 6:
					if k%21 == 6 {
						x.Clear(w)
					}
				}
			}
		}()
	}
	wwg.Wait()
	wg.Wait()
	if x.Len() > 2000 {
		t.Fatalf("bound exceeded: %d", x.Len())
	}
	total := 0
	for _, w := range ws {
		total += w.Blocks()
	}
	if total > x.Len() {
		t.Fatalf("live blocks %d > allocated %d", total, x.Len())
	}
}

// TestIndexAppendEngineHashes: the engine hashes of the leading blocks a
// worker holds, as its events named them, up to the first it lacks.
func TestIndexAppendEngineHashes(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocks: 1000})
	w := mustRegister(t, x, "w1", 4)
	other := mustRegister(t, x, "w2", 4)
	tokens := seqTokens(16, func(i int) uint32 { return uint32(7 + i) })
	want := AppendBlockHashes(nil, tokens, 4) // 4 full blocks
	x.Apply(w, batchOf(stored([]uint64{901, 902, 903}, nil, tokens[:12], 4)))
	if got := x.AppendEngineHashes(nil, w, want); !slices.Equal(got, []uint64{901, 902, 903}) {
		t.Fatalf("engine hashes %v", got)
	}
	if got := x.AppendEngineHashes([]uint64{1}, w, want[1:2]); !slices.Equal(got, []uint64{1, 902}) {
		t.Fatalf("appended %v", got)
	}
	if got := x.AppendEngineHashes(nil, other, want); len(got) != 0 {
		t.Fatalf("a worker holding nothing: %v", got)
	}
	x.Apply(w, batchOf(removed(902)))
	if got := x.AppendEngineHashes(nil, w, want); !slices.Equal(got, []uint64{901}) {
		t.Fatalf("after a removal %v", got)
	}
	x.Unregister(w)
	if got := x.AppendEngineHashes(nil, w, want); len(got) != 0 {
		t.Fatalf("unregistered: %v", got)
	}
}

// TestIndexCapacityLearnedFromRemovals: a worker's capacity is the most
// blocks the index held for it when its engine removed one; stores alone
// (the cache not yet full) and removals of unknown blocks teach nothing.
func TestIndexCapacityLearnedFromRemovals(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocks: 1000})
	w := mustRegister(t, x, "w1", 4)
	tokens := seqTokens(40, func(i int) uint32 { return uint32(7 + i) })
	engine := []uint64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	x.Apply(w, batchOf(stored(engine, nil, tokens, 4)))
	if w.Blocks() != 10 || w.Capacity() != 0 {
		t.Fatalf("after stores: blocks %d capacity %d, want 10 and 0", w.Blocks(), w.Capacity())
	}
	x.Apply(w, batchOf(removed(999)))
	if w.Capacity() != 0 {
		t.Fatalf("an unknown removal taught capacity %d", w.Capacity())
	}
	x.Apply(w, batchOf(removed(20, 19)))
	if w.Blocks() != 8 || w.Capacity() != 10 {
		t.Fatalf("after evictions: blocks %d capacity %d, want 8 and 10", w.Blocks(), w.Capacity())
	}
	// A clear is not an eviction and the engine's cache keeps its size.
	x.Apply(w, batchOf(Event{Type: EventAllBlocksCleared}))
	if w.Capacity() != 10 {
		t.Fatalf("after a clear: capacity %d, want 10", w.Capacity())
	}
}

// TestIndexCapacityReported: the cache size the engine reports stands from
// the start; removals raise it further only when the index held more, and
// neither a smaller report nor a removal lowers it.
func TestIndexCapacityReported(t *testing.T) {
	x := NewIndex(IndexConfig{MaxBlocks: 1000})
	w := mustRegister(t, x, "w1", 4)
	w.ReportCapacity(6)
	if w.Capacity() != 6 {
		t.Fatalf("reported 6: capacity %d", w.Capacity())
	}
	tokens := seqTokens(40, func(i int) uint32 { return uint32(7 + i) })
	engine := []uint64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	x.Apply(w, batchOf(stored(engine[:4], nil, tokens[:16], 4)))
	x.Apply(w, batchOf(removed(14)))
	if w.Capacity() != 6 {
		t.Fatalf("a removal at 4 blocks held: capacity %d, want the reported 6", w.Capacity())
	}
	x.Apply(w, batchOf(stored(engine, nil, tokens, 4)))
	x.Apply(w, batchOf(removed(20)))
	if w.Capacity() != 10 {
		t.Fatalf("a removal at 10 blocks held: capacity %d, want 10", w.Capacity())
	}
	w.ReportCapacity(8)
	if w.Capacity() != 10 {
		t.Fatalf("a smaller report: capacity %d, want 10 kept", w.Capacity())
	}
}
