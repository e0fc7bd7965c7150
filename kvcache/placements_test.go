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
