package kvcache

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestShardTableAgainstMap: random sets and deletes of keys crowded onto a
// few home slots (so probe runs wrap and backward shifts move entries), key
// 0 among them, against a Go map; every key's entry checked after each step.
func TestShardTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var sh shard
	sh.init()
	ref := map[uint64]entry{}
	keys := make([]uint64, 48)
	for i := range keys {
		// Low bits from a range of 4, so homes collide at every size.
		keys[i] = uint64(i)<<20 | uint64(rng.IntN(4))
	}
	keys[0] = 0
	for step := range 20000 {
		k := keys[rng.IntN(len(keys))]
		if rng.IntN(3) == 0 {
			sh.del(k)
			delete(ref, k)
		} else {
			e := entry{head: uint32(step + 1), mask: rng.Uint64() | 1}
			sh.set(k, e)
			ref[k] = e
		}
		if n := sh.tab.Load().n; n != len(ref) {
			t.Fatalf("step %d: table holds %d, want %d", step, n, len(ref))
		}
		for _, k := range keys {
			want := ref[k]
			if got := sh.get(k); got != want {
				t.Fatalf("step %d: get(%#x) = %+v, want %+v", step, k, got, want)
			}
			if got := sh.maskOf(k); got != want.mask {
				t.Fatalf("step %d: maskOf(%#x) = %#x, want %#x", step, k, got, want.mask)
			}
		}
	}
	if v := sh.ver.Load(); v&1 != 0 {
		t.Fatalf("version %d left odd", v)
	}
}

// TestShardReadersDuringWrites: readers probing without a lock (maskOf,
// and matchGroup's inlined home-slot case) while one writer inserts and
// deletes keys that share the held keys' home slots (entries shift back
// over the held ones, the table grows) and rewrites the held keys' masks.
// A held key must always read as one of its two masks, never missing, and
// a key never stored must read 0: a probe torn by a shift is retried.
func TestShardReadersDuringWrites(t *testing.T) {
	const held, churn = 6, 40
	g := newGroup()
	sh := &g.shards[0] // the keys' top bits are 0
	masks := [2]uint64{0x5, 0xa0}
	heldKeys := make([]uint64, held)
	for i := range heldKeys {
		heldKeys[i] = uint64(i+1)<<32 | 3
		sh.set(heldKeys[i], entry{head: 1, mask: masks[0]})
	}
	absent := uint64(999)<<32 | 3
	var stop atomic.Bool
	var bad atomic.Value
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lookup := sh.maskOf
			if r%2 == 1 {
				lookup = func(h uint64) uint64 { return matchedMask(g, h, masks[0]|masks[1]) }
			}
			for !stop.Load() {
				for _, k := range heldKeys {
					if m := lookup(k); m != masks[0] && m != masks[1] {
						bad.Store(m)
					}
				}
				if m := lookup(absent); m != 0 {
					bad.Store(m)
				}
			}
		}()
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for step := range 300000 {
		k := uint64(rng.IntN(churn)+100)<<32 | 3
		if step%2 == 0 {
			sh.set(k, entry{head: 2, mask: 1})
		} else {
			sh.del(k)
		}
		if step%5 == 0 {
			h := heldKeys[step%held]
			sh.set(h, entry{head: 1, mask: masks[step/5%2]})
		}
	}
	stop.Store(true)
	wg.Wait()
	if m := bad.Load(); m != nil {
		t.Fatalf("a reader saw mask %#x", m)
	}
}

// matchedMask is the mask matchGroup reads for h among the workers of live:
// those still matching after h.
func matchedMask(g *group, h, live uint64) uint64 {
	q := groupQuery{g: g, live: live}
	matchGroup(&q, []uint64{h})
	return q.active
}

// TestShardReadersWaitOutAWrite: while a writer is mid-change (the shard's
// lock held, its version odd) and a held key's slot reads empty, neither
// maskOf nor matchGroup's inlined case answers; once the write completes
// both answer the key's mask.
func TestShardReadersWaitOutAWrite(t *testing.T) {
	g := newGroup()
	sh := &g.shards[0]
	k := uint64(1)<<32 | 3
	sh.set(k, entry{head: 1, mask: 0x5})
	sh.mu.Lock()
	sh.ver.Add(1)
	tab := sh.tab.Load()
	sl := &tab.slots[tab.find(k)]
	sl.mask.Store(0)
	got := make(chan uint64, 2)
	go func() { got <- sh.maskOf(k) }()
	go func() { got <- matchedMask(g, k, 0x5) }()
	for range 1000 {
		runtime.Gosched()
		if len(got) != 0 {
			t.Fatalf("a reader answered %#x during a write", <-got)
		}
	}
	sl.mask.Store(0x5)
	sh.ver.Add(1)
	sh.mu.Unlock()
	for range 2 {
		if m := <-got; m != 0x5 {
			t.Fatalf("after the write: %#x, want 0x5", m)
		}
	}
}
