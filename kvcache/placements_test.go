package kvcache

import (
	"testing"
)

func TestPlacementsMatchRecord(t *testing.T) {
	p := NewPlacements(100, 1000)
	a := []uint64{1, 2, 3, 4}
	if got := p.Match(a, 0); got != 0 {
		t.Fatalf("empty match = %d", got)
	}
	p.Record(a, 10)
	if got := p.Match(a, 20); got != 4 {
		t.Fatalf("match = %d, want 4", got)
	}
	if got := p.Match([]uint64{1, 2, 9, 4}, 20); got != 2 {
		t.Fatalf("diverging match = %d, want 2", got)
	}
	// TTL: placed at ~10, expired from 1010 on.
	if got := p.Match(a, 2000); got != 0 {
		t.Fatalf("match after ttl = %d, want 0", got)
	}
	// A later Record drops the expired entries.
	p.Record([]uint64{7}, 2000)
	if got := p.Len(); got != 1 {
		t.Fatalf("len after expiry = %d, want 1", got)
	}
}

func TestPlacementsCapacityLRU(t *testing.T) {
	p := NewPlacements(6, 0)
	hot := []uint64{1, 2, 3}
	now := int64(0)
	for i := range 20 {
		now++
		p.Record(hot, now)
		// A cold prompt sharing the hot prefix, with a unique tail.
		now++
		p.Record([]uint64{1, 2, 3, uint64(100 + i)}, now)
		if p.Len() > 6 {
			t.Fatalf("len %d over the bound", p.Len())
		}
	}
	if got := p.Match(hot, now); got != 3 {
		t.Fatalf("hot prefix evicted: match %d", got)
	}
	if got := p.Match([]uint64{1, 2, 3, 100}, now); got != 3 {
		t.Fatalf("oldest tail kept: match %d", got)
	}
	if got := p.Match([]uint64{1, 2, 3, 119}, now); got != 4 {
		t.Fatalf("newest tail lost: match %d", got)
	}
	// Longer than the bound: only the head is kept.
	p.Record([]uint64{50, 51, 52, 53, 54, 55, 56, 57}, now+1)
	if got := p.Match([]uint64{50, 51, 52, 53, 54, 55, 56, 57}, now+1); got != 6 {
		t.Fatalf("long prompt match %d, want 6", got)
	}
	p.Clear()
	if p.Len() != 0 || p.Match(hot, now) != 0 {
		t.Fatal("Clear left placements")
	}
}

func TestPlacementsWrapAndGrow(t *testing.T) {
	// Expiry frees the ring's head, later records wrap, and growth must
	// linearise the ring without losing entries.
	p := NewPlacements(64, 100)
	now := int64(0)
	for i := range 16 {
		p.Record([]uint64{uint64(i)}, now)
		now += 10
	}
	now += 60 // the first ~12 expire at the next Record
	for i := range 40 {
		p.Record([]uint64{uint64(1000 + i)}, now)
	}
	for i := range 40 {
		if p.Match([]uint64{uint64(1000 + i)}, now) != 1 {
			t.Fatalf("lost %d", 1000+i)
		}
	}
}

func TestPlacementsAllocs(t *testing.T) {
	p := NewPlacements(1<<10, 0)
	hashes := AppendChainHashes(nil, 42, 64)
	now := int64(0)
	for range 64 {
		now++
		p.Record(hashes, now)
	}
	if n := testing.AllocsPerRun(100, func() {
		now++
		p.Record(hashes, now)
		p.Match(hashes, now)
	}); n != 0 {
		t.Fatalf("%.1f allocs, want 0", n)
	}
}

func TestAppendByteHashes(t *testing.T) {
	a := AppendByteHashes(nil, []byte("0123456789abcdefXYZ"), 8)
	b := AppendByteHashes(nil, []byte("0123456789abcdeQ"), 8)
	if len(a) != 2 || len(b) != 2 || a[0] != b[0] || a[1] == b[1] {
		t.Fatalf("a %x b %x", a, b)
	}
	if got := AppendByteHashes(nil, []byte("short"), 8); len(got) != 0 {
		t.Fatalf("partial chunk hashed: %x", got)
	}
	c := AppendChainHashes(nil, 7, 3)
	if len(c) != 3 || c[0] != 7 || c[1] == c[2] {
		t.Fatalf("chain %x", c)
	}
}

// TestPlacementsHeld: with placement times on the cache's intake clock, a
// prefix counts as held while what came in since its last placement stays
// below the capacity minus the prefix, block by block; a hash the view
// forgot is taken as placed no later than its newest dropped placement.
func TestPlacementsHeld(t *testing.T) {
	p := NewPlacements(8, 0)
	prefix := []uint64{1, 2, 3, 4}
	// Times 1000 (block 3, recorded first) to 1003 (block 0).
	p.Record(prefix, 1000)
	// Capacity 1000 units, blocks of 100: block j is held while the
	// intake since its placement is below 1000 − 100×(j+1).
	for _, c := range []struct {
		since int64 // after block 0's placement
		want  int
	}{{0, 4}, {500, 4}, {597, 3}, {700, 2}, {850, 1}, {900, 0}} {
		if got := p.Held(prefix, 1003+c.since, 1000, 100); got != c.want {
			t.Errorf("intake %d since: held %d, want %d", c.since, got, c.want)
		}
	}
	// A hash never placed, before the view dropped anything, stops nothing.
	if got := p.Held([]uint64{1, 99, 3}, 1003, 1000, 100); got != 3 {
		t.Fatalf("unknown middle hash: held %d, want 3", got)
	}
	// Past the bound the first four are dropped: a hash the view no longer
	// holds is as old as the newest dropped placement (1003).
	p.Record([]uint64{5, 6, 7, 8, 9, 10, 11, 12}, 2000)
	if p.forgot != 1003 {
		t.Fatalf("forgot %d, want 1003", p.forgot)
	}
	if got := p.Held(prefix, 1005, 1000, 100); got != 4 {
		t.Fatalf("forgotten but recent: held %d, want 4", got)
	}
	if got := p.Held(prefix, 2000, 1000, 100); got != 0 {
		t.Fatalf("forgotten and old: held %d, want 0", got)
	}
}
